"""Figures for docs/migration.md (slow tier): replay throughput at --speed max, schedule lag
p99 at speed 1, reconcile time, for a synthetic trace of MQGW_REPLAY_BENCH_N messages
(default 1,000,000) from 8 publishers, into a local gateway. The speed-1 run replays its own
capture of MQGW_REPLAY_BENCH_PACED_N messages (default 60,000) taken at
MQGW_REPLAY_BENCH_RATE msgs/s (default 2,000); its lag comes from its results."""

from __future__ import annotations

import base64
import datetime
import json
import os
import time
from pathlib import Path

import pika
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from bench.servers import GatewayServer
from replay.reconcile import ReconcileOptions, reconcile
from replay.run import RunOptions, run_replay

N = int(os.environ.get("MQGW_REPLAY_BENCH_N", "1000000"))
PACED_N = int(os.environ.get("MQGW_REPLAY_BENCH_PACED_N", "60000"))
CAPTURED_RATE = float(os.environ.get("MQGW_REPLAY_BENCH_RATE", "2000"))
PUBLISHERS = 8


def sending_span_s(run_dir: Path) -> float:
    """First send to last confirm, from the run's results."""
    results = pq.read_table(run_dir / "results.parquet", columns=["sent_ms", "done_ms"])
    return (pc.max(results["done_ms"]).as_py() - pc.min(results["sent_ms"]).as_py()) / 1000


def lag_quantiles(run_dir: Path) -> list[float]:
    lags = pq.read_table(run_dir / "results.parquet", columns=["lag_ms"])["lag_ms"]
    return [round(q, 1) for q in pc.quantile(lags, q=[0.5, 0.99, 1.0]).to_pylist()]


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
        write_trace(trace, N, span_s=N / CAPTURED_RATE)
        started = time.monotonic()
        fast = run_replay(
            spark,
            RunOptions(trace, "rabbitmq-trace", gateway.url, tmp_path / "fast", speed=float("inf")),
        )
        fast_s = time.monotonic() - started
        print(f"replayed {fast.confirmed} in {fast_s:.1f} s (job {fast.seconds:.1f} s)", flush=True)
        assert fast.confirmed == N
        sending_s = sending_span_s(tmp_path / "fast")
        started = time.monotonic()
        report = reconcile(
            spark, ReconcileOptions(trace, "rabbitmq-trace", gateway.data_dir, tmp_path / "fast")
        )
        reconcile_s = time.monotonic() - started
        print(f"reconciled in {reconcile_s:.1f} s", flush=True)
        assert report["ok"]
        paced_trace = tmp_path / "paced.log"
        write_trace(paced_trace, PACED_N, span_s=PACED_N / CAPTURED_RATE)
        paced = run_replay(
            spark,
            RunOptions(paced_trace, "rabbitmq-trace", gateway.url, tmp_path / "paced", speed=1.0),
        )
        assert paced.confirmed == PACED_N
        p50, p99, worst = lag_quantiles(tmp_path / "paced")
    finally:
        gateway.stop()
    figures = {
        "messages": N,
        "replay_msgs_per_s_unbounded": round(N / sending_s),
        "replay_sending_s_first_send_to_last_confirm": round(sending_s, 1),
        "replay_job_s": round(fast.seconds, 1),
        "replay_wall_s_including_planning": round(fast_s, 1),
        "reconcile_s": round(reconcile_s, 1),
        "speed1_messages": paced.confirmed,
        "speed1_captured_msgs_per_s": CAPTURED_RATE,
        "speed1_lag_ms_p50_p99_max": [p50, p99, worst],
    }
    print(json.dumps(figures))
