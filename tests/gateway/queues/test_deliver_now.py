"""Write-through without the append (QueueRuntime.deliver_now): a transient message into an
empty plain queue whose consumers are all no-ack goes straight to one of them and is never
stored; anything else (persistent, a backlog, an acking consumer, confirms) is stored first,
and the order a consumer sees is publish order either way."""

from __future__ import annotations

import base64
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.servers import check_for, free_port
from tests.harness.processes import GatewayProcess

TRANSIENT = pika.BasicProperties(delivery_mode=1)
PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    process = GatewayProcess(tmp_path / "data", ["--admin-port", str(free_port())]).start()
    yield process
    process.stop()


def _queue(gateway: GatewayProcess, name: str) -> dict[str, Any]:
    status, body = gateway.admin("GET", f"/api/queues/%2F/{name}")
    assert status == 200, body
    assert isinstance(body, dict)
    return body


def _stored(gateway: GatewayProcess, name: str) -> int:
    """Messages the store holds for the queue (its partition's end offset)."""
    return sum(p["max_offset"] for p in _queue(gateway, name)["mqgw"]["partition_details"])


def _consume(ch: Any, queue: str, count: int, no_ack: bool = True) -> list[bytes]:
    got: list[bytes] = []
    for method, _props, body in ch.consume(queue, auto_ack=no_ack, inactivity_timeout=10):
        assert method is not None, f"only {len(got)} of {count} arrived"
        got.append(body)
        if not no_ack:
            ch.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    return got


def _wait_consuming(gateway: GatewayProcess, queue: str) -> None:
    """The consumer is attached and the queue has read its (empty) store: caught up."""
    check_for(10, lambda: _queue(gateway, queue)["consumers"] == 1)


def test_transient_no_ack_is_delivered_without_being_stored(gateway: GatewayProcess) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(gateway.url))
    pub = conn.channel()
    con = pika.BlockingConnection(pika.URLParameters(gateway.url)).channel()
    pub.queue_declare("direct")
    for body in (b"p0", b"p1"):  # a backlog, stored: it goes out first
        pub.basic_publish("", "direct", body, PERSISTENT)
    pub.basic_publish("", "direct", b"t-backlog", TRANSIENT)
    check_for(10, lambda: _stored(gateway, "direct") == 3)
    first = _consume(con, "direct", 3)
    assert first == [b"p0", b"p1", b"t-backlog"]
    _wait_consuming(gateway, "direct")
    check_for(10, lambda: _queue(gateway, "direct")["messages"] == 0)
    # Caught up: transient messages skip the store; a persistent one in between is stored,
    # and the order holds across both paths.
    bodies = [b"t%d" % i for i in range(200)]
    for i, body in enumerate(bodies):
        pub.basic_publish("", "direct", body, PERSISTENT if i == 100 else TRANSIENT)
    got = _consume(con, "direct", len(bodies))
    assert got == bodies
    details = _queue(gateway, "direct")
    assert details["mqgw"]["published"] == 203
    assert details["mqgw"]["delivered"] == 203
    assert details["mqgw"]["acked"] == 203
    assert details["messages"] == 0
    # The three of the backlog, the persistent one, and at most the few transient ones that
    # met the queue between the persistent one's append and its delivery.
    assert 4 <= _stored(gateway, "direct") < 4 + 100
    conn.close()


@pytest.mark.parametrize("case", ["ack", "confirm", "persistent"])
def test_everything_else_is_stored(gateway: GatewayProcess, case: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(gateway.url))
    pub = conn.channel()
    con = pika.BlockingConnection(pika.URLParameters(gateway.url)).channel()
    pub.queue_declare("kept")
    if case == "confirm":
        pub.confirm_delivery()
    props = PERSISTENT if case == "persistent" else TRANSIENT
    got: list[bytes] = []

    def on_message(ch: Any, method: Any, _props: Any, body: bytes) -> None:
        got.append(body)
        if case == "ack":
            ch.basic_ack(method.delivery_tag)

    con.basic_consume("kept", on_message, auto_ack=case != "ack")
    _wait_consuming(gateway, "kept")
    bodies = [b"m%d" % i for i in range(20)]
    for body in bodies:
        pub.basic_publish("", "kept", body, props)
    check_for(10, lambda: con.connection.process_data_events(0.05) or len(got) == len(bodies))
    assert got == bodies
    assert _stored(gateway, "kept") == len(bodies)
    conn.close()


def test_transient_confirms_do_not_wait_for_an_fsync(gateway: GatewayProcess) -> None:
    """RabbitMQ confirms a transient message once its queues have it, with no fsync; a
    persistent one after. The gateway's durability waits (mqgw_store_durable_wait_seconds)
    count only the latter."""
    conn = pika.BlockingConnection(pika.URLParameters(gateway.url))
    ch = conn.channel()
    ch.queue_declare("confirmed", durable=True)
    ch.confirm_delivery()
    waits = _durable_waits(gateway)
    for n in range(50):
        ch.basic_publish("", "confirmed", b"t%d" % n, TRANSIENT)  # each returns once acked
    assert _durable_waits(gateway) == waits
    for n in range(5):
        ch.basic_publish("", "confirmed", b"p%d" % n, PERSISTENT)
    assert _durable_waits(gateway) == waits + 5
    assert _queue(gateway, "confirmed")["messages"] == 55
    conn.close()


def _durable_waits(gateway: GatewayProcess) -> float:
    request = urllib.request.Request(f"http://127.0.0.1:{gateway.admin_port}/metrics")
    request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "mqgw_store_durable_wait_seconds_count":
                return sample.value
    raise AssertionError("no mqgw_store_durable_wait_seconds in /metrics")
