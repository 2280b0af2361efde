"""The mqgw-log source: a time window of one gateway's log (read while it runs) replayed into
another gateway and reconciled; and an unreachable target refused before Spark starts."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pika
from pyspark.sql import SparkSession

from bench.servers import GatewayServer, free_port
from replay.reconcile import ReconcileOptions, reconcile
from replay.run import RunOptions, malformed_rows, run_replay
from replay.spark import load_capture


def declare(url: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    ch = connection.channel()
    ch.exchange_declare("events", "topic", durable=True)
    ch.queue_declare("audit", durable=True)
    ch.queue_declare("paid", durable=True)
    ch.queue_bind("audit", "events", "#")
    ch.queue_bind("paid", "events", "order.paid")
    connection.close()


def publish(url: str, tag: str, count: int) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    ch = connection.channel()
    ch.confirm_delivery()
    for i in range(count):
        key = "order.paid" if i % 2 else "order.new"
        props = pika.BasicProperties(headers={"tag": tag, "i": i}, message_id=f"{tag}-{i}")
        ch.basic_publish("events", key, bytes([i % 256]) * (i + 1) + b"\x00\xff", props)
    connection.close()


def test_a_time_window_of_one_log_replays_into_another(spark: SparkSession, tmp_path: Path) -> None:
    source = GatewayServer(tmp_path / "source").start()
    target = GatewayServer(tmp_path / "target").start()
    try:
        declare(source.url)
        declare(target.url)
        publish(source.url, "before", 10)
        time.sleep(0.05)  # distinct store milliseconds around the window's edges
        window_from = time.time_ns() // 1_000_000
        publish(source.url, "inside", 40)
        window_to = time.time_ns() // 1_000_000 + 1
        time.sleep(0.05)
        publish(source.url, "after", 10)
        # The source keeps running: its log is read up to its last complete record.
        log = spark.read.format("mqgw-log").load(str(source.data_dir))
        assert log.count() == 60
        paid = log.filter("array_contains(queues, 'paid')").count()
        assert paid == 30
        out = tmp_path / "run"
        options = RunOptions(
            source.data_dir,
            "mqgw-log",
            target.url,
            out,
            speed=float("inf"),
            order_key="routing-key",
            from_ms=window_from,
            to_ms=window_to,
        )
        summary = run_replay(spark, options)
        assert (summary.messages, summary.confirmed) == (40, 40)
        report = reconcile(
            spark, ReconcileOptions(source.data_dir, "mqgw-log", target.data_dir, out)
        )
        replayed = (
            spark.read.format("mqgw-log").load(str(target.data_dir)).orderBy("offset").collect()
        )
    finally:
        source.stop()
        target.stop()
    assert report["ok"], report["totals"]
    assert report["totals"]["expected"] == report["totals"]["arrived"] == 60  # 40 + 20 to paid
    assert report["totals"]["body_mismatches"] == report["totals"]["property_mismatches"] == 0
    assert [json.loads(r["properties"]["headers"])["tag"] for r in replayed] == ["inside"] * 40
    by_key: dict[str, list[int]] = {}
    for row in replayed:
        by_key.setdefault(row["routing_key"], []).append(
            json.loads(row["properties"]["headers"])["i"]
        )
    assert all(seq == sorted(seq) for seq in by_key.values()) and len(by_key) == 2


def test_an_unreachable_target_fails_fast(tmp_path: Path) -> None:
    trace = tmp_path / "t.log"
    trace.write_text("")
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mqgw_cli.main",
            "replay",
            "run",
            "--capture",
            str(trace),
            "--format",
            "rabbitmq-trace",
            "--target",
            f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "cannot connect to target amqp://guest:***@127.0.0.1:" in result.stderr
    assert time.monotonic() - started < 15  # no Spark started
    assert not (tmp_path / "out").exists()


def test_malformed_trace_lines_are_counted_with_line_numbers(
    spark: SparkSession, tmp_path: Path
) -> None:
    good = json.dumps(
        {
            "type": "published",
            "timestamp": "2026-01-02T03:04:05.678+00:00",
            "exchange": "",
            "routing_keys": ["q"],
            "payload": "AA==",
            "properties": {},
        }
    )
    trace = tmp_path / "t.log"
    trace.write_text(f'{good}\n[]\n{good}\n{{"type": 1}}\n{good}\n{good[:30]}')
    frame = load_capture(spark, trace, "rabbitmq-trace")
    assert frame.filter("error IS NULL").count() == 3
    problems = malformed_rows(frame)
    assert [(p["line"], p["error"].split(":")[0]) for p in problems] == [
        (2, "not a JSON object"),
        (4, "missing timestamp, exchange, routing_keys, payload"),
        (6, "truncated last line (still being written?)"),
    ]
