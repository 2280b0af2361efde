"""`mqgw replay reconcile --cluster D`: a synthetic trace replayed through the gateway of a
`mqgw cluster up` with two broker groups (queues placed over both) is found complete in the
groups' logs, with queue names from the metadata on Redis; a capture that lists one more
message than was sent is reported missing it (exit 1)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from pyspark.sql import SparkSession

from mqgw_cli.main import main

REPO = Path(__file__).resolve().parents[2]
PUBLISHERS = 2
PER_PUBLISHER = 30
DIRECT = ("q-1", "q-2", "q-3", "q-4")
FANOUT = ("fan-1", "fan-2")


def cluster_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqgw_cli.main", "cluster", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A cluster of two unreplicated broker groups and one gateway, with the topology."""
    directory = tmp_path_factory.mktemp("cluster") / "c"
    started = cluster_cli("up", "--dir", str(directory), "--groups", "2", "--gateways", "1")
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        state: dict[str, Any] = json.loads((directory / "cluster.json").read_text())
        url = str(state["gateways"][0]["amqp_url"])
        connection = pika.BlockingConnection(pika.URLParameters(url))
        channel = connection.channel()
        channel.exchange_declare("fan", "fanout", durable=True)
        for queue in DIRECT + FANOUT:
            channel.queue_declare(queue, durable=True)
        for queue in FANOUT:
            channel.queue_bind(queue, "fan")
        connection.close()
        yield directory, url
    finally:
        cluster_cli("down", "--dir", str(directory))


def trace_line(number: int) -> dict[str, Any]:
    """Message ``number`` as RabbitMQ's tracer logs it: every fifth to the fanout."""
    publisher, seq = number % PUBLISHERS, number // PUBLISHERS
    if number % 5 == 4:
        exchange, key, routed = "fan", "", list(FANOUT)
    else:
        exchange, key = "", DIRECT[number % len(DIRECT)]
        routed = [key]
    return {
        "channel": 1,
        "connection": f"publisher-{publisher}",
        "exchange": exchange,
        "payload": base64.b64encode(bytes([number % 256, 0, 255]) * (seq + 1)).decode(),
        "properties": {"headers": {"publisher": publisher, "seq": seq}, "delivery_mode": 2},
        "routed_queues": routed,
        "routing_keys": [key],
        "timestamp": f"2026-01-01T00:00:{number // 100:02d}.{number % 100:02d}0+00:00",
        "type": "published",
        "vhost": "/",
    }


def write_trace(path: Path, count: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(trace_line(n)) + "\n" for n in range(count)))
    return path


def reconcile(capture: Path, directory: Path, out: Path) -> tuple[int, dict[str, Any]]:
    code = main(
        [
            "replay",
            "reconcile",
            "--capture",
            str(capture),
            "--format",
            "rabbitmq-trace",
            "--cluster",
            str(directory),
            "--out",
            str(out),
        ]
    )
    return code, json.loads((out / "report.json").read_text())


def test_reconcile_reads_every_group_of_a_cluster(
    spark: SparkSession, cluster: tuple[Path, str], tmp_path: Path
) -> None:
    directory, url = cluster
    total = PUBLISHERS * PER_PUBLISHER
    trace = write_trace(tmp_path / "sent" / "workload.log", total)
    out = tmp_path / "run"
    run = ["replay", "run", "--capture", str(trace), "--format", "rabbitmq-trace"]
    assert main([*run, "--target", url, "--speed", "max", "--out", str(out)]) == 0

    code, report = reconcile(trace, directory, out)
    totals = report["totals"]
    fanned = sum(1 for n in range(total) if n % 5 == 4)
    assert code == 0, totals
    assert totals["expected"] == totals["arrived"] == total + fanned
    assert totals["missing"] == totals["misrouted"] == totals["duplicated"] == 0
    assert totals["order_violations"] == 0
    assert totals["body_mismatches"] == totals["property_mismatches"] == 0
    assert set(report["queues"]) == set(DIRECT + FANOUT)  # names from Redis, not #<id>
    assert report["target"]["broker_groups"] == ["g1", "g2"]
    assert report["latency_ms"]["count"] == total
    # The queues were placed over both groups: the arrivals came from both logs.
    log = spark.read.format("mqgw-log").load(str(directory))
    per_group = {
        r["broker_group"]: r["count"] for r in log.groupBy("broker_group").count().collect()
    }
    assert set(per_group) == {"g1", "g2"} and sum(per_group.values()) >= total

    # The same capture (same name: the provenance header names it) with one more message,
    # never sent: that one is missing, the rest arrived; exit 1.
    longer = write_trace(tmp_path / "longer" / "workload.log", total + 1)
    code, report = reconcile(longer, directory, tmp_path / "missing")
    assert code == 1
    assert report["totals"]["missing"] == 1
    assert report["totals"]["arrived"] == total + fanned
    assert [m["capture_id"] for m in report["discrepancies"]["missing"]] == [
        f"workload.log:{total + 1}"
    ]
    assert report["ok"] is False


def test_cluster_must_be_a_cluster_dir(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.log", 1)
    code = main(
        [
            "replay",
            "reconcile",
            "--capture",
            str(trace),
            "--format",
            "rabbitmq-trace",
            "--cluster",
            str(tmp_path),
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert code == 2
