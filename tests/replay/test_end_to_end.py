"""Migration end to end: RabbitMQ (Debian's package, tracing plugin on) records a workload of
several publishers; its definitions go into a gateway; the trace is replayed at --speed 4 and
reconciled; then a target that lost, duplicated and reordered messages is reported as such.
The firehose capture command records from the same RabbitMQ."""

from __future__ import annotations

import json
import struct
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from bench.processes import check_for
from bench.rabbitmq_node import RabbitMQProcess
from bench.servers import GatewayServer, free_port
from mqgw_cli.admin_client import admin_call
from mqgw_cli.main import main
from replay.amqp_props import RawProperties, decode, encode, stamp
from replay.capture import CaptureOptions, capture
from replay.run import plan_messages
from replay.sender import SendPlan, provenance
from replay.spark import load_capture

PUBLISHERS = 3
PER_PUBLISHER = 30
ROUTES = [  # exchange, routing key, the queues RabbitMQ routes it to
    ("orders", "new", {"orders-new"}),
    ("events", "shop.order.paid", {"events-orders", "events-all"}),
    ("events", "shop.user", {"events-all"}),
    ("fan", "", {"fan-1", "fan-2"}),
    ("", "direct-q", {"direct-q"}),
]


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RabbitMQProcess, Path]]:
    base = tmp_path_factory.mktemp("rabbit")
    traces = base / "traces"
    traces.mkdir()
    config = f'[{{rabbitmq_tracing, [{{directory, "{traces}"}}]}}].'
    node = RabbitMQProcess(
        base / "node", advanced_config=config, plugins=("rabbitmq_management", "rabbitmq_tracing")
    ).start()
    check_for(60, lambda: mgmt(node, "GET", "/api/overview")[0] == 200 or None, 0.3)
    yield node, traces
    node.stop()


def mgmt(node: RabbitMQProcess, method: str, path: str, body: object = None) -> tuple[int, Any]:
    try:
        return admin_call(node.management_url, method, path, body, "guest", "guest")
    except OSError:
        return 0, None


def declare_topology(url: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    ch = connection.channel()
    ch.exchange_declare("orders", "direct", durable=True)
    ch.exchange_declare("events", "topic", durable=True)
    ch.exchange_declare("fan", "fanout", durable=True)
    for queue in ("orders-new", "events-orders", "events-all", "fan-1", "fan-2", "direct-q"):
        ch.queue_declare(queue, durable=True)
    ch.queue_bind("orders-new", "orders", "new")
    ch.queue_bind("events-orders", "events", "shop.order.*")
    ch.queue_bind("events-all", "events", "shop.#")
    ch.queue_bind("fan-1", "fan")
    ch.queue_bind("fan-2", "fan")
    connection.close()


def publish_workload(url: str) -> int:
    """PUBLISHERS connections at once, each with its own sequence and binary bodies."""

    def publisher(number: int) -> None:
        connection = pika.BlockingConnection(pika.URLParameters(url))
        ch = connection.channel()
        ch.confirm_delivery()
        for seq in range(PER_PUBLISHER):
            exchange, key, _ = ROUTES[(seq + number) % len(ROUTES)]
            body = struct.pack(">HI", number, seq) + bytes(range(256))[(seq * 7) % 200 :]
            headers = {"publisher": number, "seq": seq}
            ch.basic_publish(
                exchange, key, body, pika.BasicProperties(headers=headers, delivery_mode=2)
            )
            time.sleep(0.01)
        connection.close()

    threads = [threading.Thread(target=publisher, args=(n,)) for n in range(PUBLISHERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return PUBLISHERS * PER_PUBLISHER


def published_lines(trace: Path) -> int | None:
    if not trace.exists():
        return None
    return sum('"type":"published"' in line for line in trace.read_text().splitlines())


@pytest.fixture(scope="module")
def recorded(rabbit: tuple[RabbitMQProcess, Path]) -> tuple[Path, dict[str, Any]]:
    """The trace of the workload, and RabbitMQ's definitions."""
    node, traces = rabbit
    declare_topology(node.url)
    assert (
        mgmt(node, "PUT", "/api/traces/%2F/workload", {"format": "json", "pattern": "#"})[0] == 201
    )
    total = publish_workload(node.url)
    trace = traces / "workload.log"
    check_for(30, lambda: published_lines(trace) == total or None, 0.2)  # the plugin buffers
    assert mgmt(node, "DELETE", "/api/traces/%2F/workload")[0] == 204
    status, definitions = mgmt(node, "GET", "/api/definitions")
    assert status == 200
    return trace, definitions


def gateway_with(definitions: dict[str, Any], data_dir: Path) -> GatewayServer:
    gateway = GatewayServer(data_dir, ["--admin-port", str(free_port())]).start()
    topology = {k: definitions[k] for k in ("vhosts", "exchanges", "queues", "bindings")}
    status, answer = gateway.admin("POST", "/api/definitions", topology)
    assert status in (200, 201, 204), answer
    return gateway


def reconcile(trace: Path, gateway: GatewayServer, out: Path) -> int:
    """`mqgw replay reconcile` of the capture against what the gateway stored."""
    return main(
        ["replay", "reconcile", "--capture", str(trace), "--format", "rabbitmq-trace",
         "--store", str(gateway.data_dir), "--out", str(out)]
    )  # fmt: skip


def test_replay_at_speed_4_arrives_complete_and_in_order(
    spark: SparkSession, recorded: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    trace, definitions = recorded
    gateway = gateway_with(definitions, tmp_path / "target")
    out = tmp_path / "run"
    try:
        code = main(
            [
                "replay",
                "run",
                "--capture",
                str(trace),
                "--format",
                "rabbitmq-trace",
                "--target",
                gateway.url,
                "--speed",
                "4",
                "--out",
                str(out),
            ]
        )
        assert code == 0
        results = pq.read_table(out / "results.parquet").to_pylist()
        assert len(results) == PUBLISHERS * PER_PUBLISHER
        assert {r["outcome"] for r in results} == {"confirmed"}
        code = reconcile(trace, gateway, out)
        report = json.loads((out / "report.json").read_text())
    finally:
        gateway.stop()
    totals = report["totals"]
    expected = PER_PUBLISHER * PUBLISHERS * 7 // 5  # two routes reach two queues each
    assert code == 0, totals
    assert totals["expected"] == totals["arrived"] == expected
    assert totals["missing"] == totals["misrouted"] == totals["duplicated"] == 0
    assert totals["order_violations"] == 0
    assert totals["body_mismatches"] == totals["property_mismatches"] == 0
    assert report["order"]["keys"] == PUBLISHERS
    assert report["latency_ms"]["count"] == PUBLISHERS * PER_PUBLISHER
    assert report["pacing_error_ms"]["p99"] < 1000
    # The capture took >= 0.3 s per publisher; at speed 4 the replay spans about a quarter.
    assert sum(report["rates"]["replayed"]) > 0
    page = (out / "report.html").read_text()
    assert "<svg" in page and "<script" not in page and "http" not in page.split("<body>")[1]


def test_a_lossy_target_is_reported(
    spark: SparkSession, recorded: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """Send the capture by hand, dropping one message, sending one twice and swapping two
    consecutive messages of one publisher: reconcile names each and exits 1."""
    trace, definitions = recorded
    gateway = gateway_with(definitions, tmp_path / "target")
    planned = plan_messages(load_capture(spark, trace, "rabbitmq-trace"), "channel")
    rows = [r.asDict() for r in planned.orderBy("seq").collect()]
    publisher = [r for r in rows if r["order_key"] == rows[0]["order_key"]]
    dropped, duplicated = publisher[1], publisher[2]
    # Two of its messages to the direct exchange: one queue, which no other route reaches.
    swap_a, swap_b = [r for r in publisher if r["exchange"] == "orders"][2:4]
    order = [r for r in rows if r is not dropped]
    a, b = order.index(swap_a), order.index(swap_b)
    order[a], order[b] = order[b], order[a]
    order.insert(order.index(duplicated) + 5, duplicated)
    # Another publisher's messages: one body altered, one header value (and its type) changed.
    other = [r for r in rows if r["order_key"] != publisher[0]["order_key"]]
    altered_body, altered_header = other[3], other[4]
    plan = SendPlan(gateway.url, str(tmp_path), "t", trace.name, 0.0, 0, 1.0, None)
    connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
    channel = connection.channel()
    channel.confirm_delivery()
    for row in order:
        body, properties = row["body"], row["properties_raw"]
        if row is altered_body:
            body = body + b"!"
        if row is altered_header:
            headers = decode(properties).headers
            properties = encode(
                pika.BasicProperties(
                    headers={**headers, "seq": str(headers["seq"])}, delivery_mode=2
                )
            )
        raw = stamp(properties, provenance(plan, row))
        channel.basic_publish(row["exchange"], row["routing_key"], body, RawProperties(raw))
    connection.close()
    out = tmp_path / "reconcile"
    try:
        code = reconcile(trace, gateway, out)
    finally:
        gateway.stop()
    assert code == 1
    report = json.loads((out / "report.json").read_text())
    found = report["discrepancies"]
    assert {m["capture_id"] for m in found["missing"]} == {dropped["capture_id"]}
    assert report["totals"]["missing"] == len(dropped["routed_queues"])
    assert {m["capture_id"] for m in found["duplicated"]} == {duplicated["capture_id"]}
    assert {m["capture_id"] for m in found["out_of_order"]} == {swap_a["capture_id"]}
    assert report["totals"]["order_violations"] == 1
    assert report["totals"]["misrouted"] == 0
    assert [m["capture_id"] for m in found["body_mismatch"]] == [altered_body["capture_id"]]
    assert [m["capture_id"] for m in found["property_mismatch"]] == [altered_header["capture_id"]]
    assert report["totals"]["body_mismatches"] == report["totals"]["property_mismatches"] == 1
    assert report["ok"] is False


def test_capture_records_the_firehose_and_switches_tracing_off(
    spark: SparkSession, rabbit: tuple[RabbitMQProcess, Path], tmp_path: Path
) -> None:
    node, _ = rabbit
    declare_topology(node.url)
    out = tmp_path / "capture"
    options = CaptureOptions(
        node.url, out, node.management_url, duration_s=30, count=PUBLISHERS * PER_PUBLISHER
    )
    done: list[Any] = []
    recorder = threading.Thread(target=lambda: done.append(capture(options, progress_s=0.5)))
    recorder.start()
    check_for(10, lambda: mgmt(node, "GET", "/api/vhosts/%2F")[1]["tracing"] or None, 0.1)
    publish_workload(node.url)
    recorder.join(60)
    assert done and done[0].written == PUBLISHERS * PER_PUBLISHER
    assert (
        mgmt(node, "GET", "/api/vhosts/" + urllib.parse.quote("/", safe=""))[1]["tracing"] is False
    )
    frame = load_capture(spark, out, "firehose")
    rows = frame.orderBy("seq").collect()
    assert len(rows) == PUBLISHERS * PER_PUBLISHER and all(r["error"] is None for r in rows)
    by_publisher: dict[str, list[int]] = {}
    for row in rows:
        headers = json.loads(row["properties"]["headers"])
        by_publisher.setdefault(row["connection"], []).append(headers["seq"])
        assert set(row["routed_queues"]) == next(
            q for x, k, q in ROUTES if (x, k) == (row["exchange"], row["routing_key"])
        )
    assert len(by_publisher) == PUBLISHERS
    assert all(seqs == list(range(PER_PUBLISHER)) for seqs in by_publisher.values())
