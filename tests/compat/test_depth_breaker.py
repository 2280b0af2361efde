"""Depth breakers (policy ``breaker``, gateway/queues/breaker.py) on a real gateway with pika:
a queue's breaker trips at the publish that would pass ``high``, refuses (reject) or holds its
publishers (block) until the depth is below ``low``, and never touches another queue."""

from __future__ import annotations

import base64
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.harness.processes import GatewayProcess, check_for
from tests.harness.rabbitmq import free_port

OF = 100  # high 0.7 -> trips above 70; low 0.5 -> resets below 50


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    """With its admin API (the policies and the breaker's state)."""
    process = GatewayProcess(tmp_path / "data", ["--admin-port", str(free_port())]).start()
    yield process
    process.stop()


def set_breaker_policy(gateway: GatewayProcess, name: str, action: str) -> None:
    definition = {"breaker": {"high": 0.7, "low": 0.5, "of": OF, "action": action}}
    status, _ = gateway.admin("PUT", f"/api/policies/%2F/{name}",
                              {"pattern": f"^{name}$", "definition": definition})  # fmt: skip
    assert status in (201, 204)


def confirm_channel(gateway: GatewayProcess) -> tuple[pika.BlockingConnection, BlockingChannel]:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gateway.amqp_port))
    channel = conn.channel()
    channel.confirm_delivery()
    return conn, channel


def publish(channel: BlockingChannel, queue: str, body: bytes) -> bool:
    """True if confirmed, False if nacked."""
    try:
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    except pika.exceptions.NackError:
        return False
    return True


def breaker_of(gateway: GatewayProcess, queue: str) -> dict[str, Any]:
    status, body = gateway.admin("GET", f"/api/queues/%2F/{queue}")
    assert status == 200
    breaker: dict[str, Any] = body["mqgw"]["breaker"]
    return breaker


def _take(channel: BlockingChannel, queue: str, count: int) -> list[bytes]:
    taken: list[bytes] = []
    for _ in range(count):
        _, _, body = channel.basic_get(queue, auto_ack=True)
        assert body is not None, f"queue {queue} ran dry after {len(taken)}"
        taken.append(body)
    return taken


def test_a_reject_breaker_nacks_above_high_until_below_low(gateway: GatewayProcess) -> None:
    set_breaker_policy(gateway, "deep", "reject")
    conn, ch = confirm_channel(gateway)
    ch.queue_declare("deep", durable=True)
    ch.queue_declare("free", durable=True)
    outcomes = [publish(ch, "deep", b"%d" % i) for i in range(100)]
    assert outcomes == [True] * 70 + [False] * 30  # 71 would pass high: refused, tripped
    assert all(publish(ch, "free", b"x") for _ in range(300))  # another queue: untouched
    assert int(ch.queue_declare("deep", passive=True).method.message_count) == 70
    breaker = breaker_of(gateway, "deep")
    assert (breaker["state"], breaker["trips"], breaker["refused_publishes"]) == ("tripped", 1, 30)
    check_for(5, lambda: "depth breaker tripped at 71 ready messages" in gateway.log())

    taken = _take(ch, "deep", 20)  # 50 left: not below low
    assert not publish(ch, "deep", b"still")
    taken += _take(ch, "deep", 1)  # 49: the watch resets it without a publish
    check_for(5, lambda: breaker_of(gateway, "deep")["state"] == "closed")
    check_for(5, lambda: "depth breaker reset at 49 ready messages" in gateway.log())
    assert publish(ch, "deep", b"after")
    assert taken == [b"%d" % i for i in range(21)]  # what was confirmed, in order
    breaker = breaker_of(gateway, "deep")
    assert breaker["trips"] == 1 and breaker["tripped_seconds"] > 0

    text = _metrics(gateway)
    assert _metric(text, "mqgw_queue_breaker_trips_total", "deep") == 1.0
    assert _metric(text, "mqgw_queue_breaker_tripped", "deep") == 0.0
    conn.close()


def _metric(text: str, name: str, queue: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and f'queue="{queue}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} for {queue}")


def test_a_block_breaker_holds_only_its_publishers(gateway: GatewayProcess) -> None:
    set_breaker_policy(gateway, "held", "block")
    conn, ch = confirm_channel(gateway)
    ch.queue_declare("held", durable=True)
    ch.queue_declare("other", durable=True)
    confirmed: list[int] = []
    nacked: list[int] = []

    def publish_held() -> None:
        c, channel = confirm_channel(gateway)
        for i in range(150):
            (confirmed if publish(channel, "held", b"%d" % i) else nacked).append(i)
        c.close()

    publisher = threading.Thread(target=publish_held, daemon=True)
    publisher.start()
    check_for(10, lambda: breaker_of(gateway, "held")["state"] == "tripped")
    check_for(5, lambda: _flow(gateway))  # held: its connection is not read
    stuck_at = len(confirmed)
    assert 71 <= stuck_at < 150 and not nacked

    started = time.monotonic()
    assert all(publish(ch, "other", b"y") for _ in range(1000))  # full speed meanwhile
    other_s = time.monotonic() - started
    assert len(confirmed) == stuck_at, "the held publisher went on while tripped"
    assert other_s < 10, f"another queue's publisher took {other_s:.1f} s for 1,000"

    text = _metrics(gateway)
    assert _metric(text, "mqgw_queue_breaker_tripped", "held") == 1.0
    assert _metric(text, "mqgw_queue_breaker_tripped", "other") == 0.0

    taken: list[bytes] = []
    while len(taken) < 150:  # consuming resets it; the publisher goes on to the end
        _, _, body = ch.basic_get("held", auto_ack=True)
        if body is None:
            time.sleep(0.01)
            assert publisher.is_alive() or len(confirmed) == 150
            continue
        taken.append(body)
    publisher.join(10)
    assert not publisher.is_alive()
    assert not nacked and len(confirmed) == 150
    assert taken == [b"%d" % i for i in range(150)]  # none lost, none twice, in order
    check_for(5, lambda: "depth breaker reset" in gateway.log())
    assert breaker_of(gateway, "held")["trips"] >= 1
    conn.close()


def _metrics(gateway: GatewayProcess) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{gateway.admin_port}/metrics/per-object")
    token = base64.b64encode(b"guest:guest").decode()
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.read().decode())


def _flow(gateway: GatewayProcess) -> bool:
    status, connections = gateway.admin("GET", "/api/connections")
    assert status == 200
    return any(c["state"] == "flow" for c in connections)


BAD = [
    ({"high": 1.5}, "'high' must be a number above 0 and at most 1"),
    ({"high": 0.4, "low": 0.6}, "'low' (0.6) must not be above 'high' (0.4)"),
    ({"of": 0}, "'of' must be \"max-length\" or a positive number"),
    ({"action": "drop"}, "'action' must be one of reject, block"),
    ({"hgh": 0.7}, "unknown: hgh"),
    ("on", "must be an object"),
]


def test_a_bad_breaker_policy_is_400_with_the_reason(gateway: GatewayProcess) -> None:
    for breaker, reason in BAD:
        body = {"pattern": "^x$", "definition": {"breaker": breaker}}
        status, answer = gateway.admin("PUT", "/api/policies/%2F/bad", body)
        assert status == 400, breaker
        assert reason in answer["reason"]
    status, policies = gateway.admin("GET", "/api/policies/%2F")
    assert status == 200 and policies == []
    assert gateway.admin("GET", "/api/policies/%2F/bad")[0] == 404
    set_breaker_policy(gateway, "good", "block")
    status, policy = gateway.admin("GET", "/api/policies/%2F/good")
    assert status == 200 and policy["definition"]["breaker"]["action"] == "block"
