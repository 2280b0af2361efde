"""Figures for docs/migration.md (slow tier): replay throughput at --speed max, schedule lag
p99 at speed 1, reconcile time, for a synthetic trace of MQGW_REPLAY_BENCH_N messages
(default 1,000,000) from 8 publishers, into a local gateway."""

from __future__ import annotations

import base64
import datetime
import json
import os
import time
from pathlib import Path

import pika
import pytest
from pyspark.sql import SparkSession

from bench.servers import GatewayServer
from replay.reconcile import ReconcileOptions, reconcile
from replay.run import RunOptions, run_replay

N = int(os.environ.get("MQGW_REPLAY_BENCH_N", "1000000"))
PUBLISHERS = 8


def write_trace(path: Path, count: int, span_s: float) -> None:
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    with path.open("w") as out:
        for i in range(count):
            moment = start + datetime.timedelta(seconds=span_s * i / count)
            stamp = moment.isoformat(timespec="milliseconds")
            line = {
                "channel": 1,
                "connection": f"publisher-{i % PUBLISHERS}",
                "exchange": "",
                "payload": base64.b64encode(i.to_bytes(8, "big") * 8).decode(),
                "properties": {"headers": {"i": i}},
                "routed_queues": ["bench"],
                "routing_keys": ["bench"],
                "timestamp": stamp,
                "type": "published",
                "vhost": "/",
            }
            out.write(json.dumps(line) + "\n")


@pytest.mark.slow
def test_replay_figures(spark: SparkSession, tmp_path: Path) -> None:
    gateway = GatewayServer(tmp_path / "gw", flush="async").start()
    try:
        connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
        connection.channel().queue_declare("bench", durable=True)
        connection.close()
        trace = tmp_path / "bench.log"
        write_trace(trace, N, span_s=N / 2000)  # 2,000 msgs/s in the capture
        started = time.monotonic()
        fast = run_replay(
            spark,
            RunOptions(trace, "rabbitmq-trace", gateway.url, tmp_path / "fast", speed=float("inf")),
        )
        fast_s = time.monotonic() - started
        assert fast.confirmed == N
        started = time.monotonic()
        report = reconcile(
            spark, ReconcileOptions(trace, "rabbitmq-trace", gateway.data_dir, tmp_path / "fast")
        )
        reconcile_s = time.monotonic() - started
        assert report["ok"]
        paced_n = min(N, 60_000)  # 30 s of capture at speed 1
        paced_trace = tmp_path / "paced.log"
        write_trace(paced_trace, paced_n, span_s=paced_n / 2000)
        paced = run_replay(
            spark,
            RunOptions(paced_trace, "rabbitmq-trace", gateway.url, tmp_path / "paced", speed=1.0),
        )
        lag = reconcile(
            spark,
            ReconcileOptions(paced_trace, "rabbitmq-trace", gateway.data_dir, tmp_path / "paced"),
        )["pacing_error_ms"]
    finally:
        gateway.stop()
    figures = {
        "messages": N,
        "replay_msgs_per_s_unbounded": round(N / fast.seconds),
        "replay_wall_s_including_planning": round(fast_s, 1),
        "reconcile_s": round(reconcile_s, 1),
        "speed1_messages": paced.confirmed,
        "speed1_lag_p99_ms": lag["p99"],
        "speed1_lag_p50_ms": lag["p50"],
    }
    print(json.dumps(figures))
