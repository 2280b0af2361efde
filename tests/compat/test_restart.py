"""Restart: publish with confirms, stop the gateway (SIGTERM, SIGKILL), start it, consume.
Nothing confirmed is missing; nothing appears twice unless it was delivered unacked."""

from __future__ import annotations

import signal
from pathlib import Path

import pika
import pytest

from tests.harness.processes import GatewayProcess, check_for


def _publish(url: str, start: int, count: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("durable_q", durable=True)
    ch.exchange_declare("durable_x", "fanout", durable=True)
    ch.queue_bind("durable_q", "durable_x")
    for i in range(start, start + count):
        ch.basic_publish("durable_x", "", b"%d" % i, pika.BasicProperties(delivery_mode=2))
    conn.close()


def _drain(url: str, ack_first: int | None = None) -> list[int]:
    """Consume everything; ack only the first ``ack_first`` (all if None)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    seen = []
    for method, _props, body in ch.consume("durable_q", inactivity_timeout=1):
        if method is None:
            break
        seen.append(int(body))
        if ack_first is None or len(seen) <= ack_first:
            ch.basic_ack(method.delivery_tag)
    conn.close()
    return seen


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_confirmed_messages_survive_a_restart(tmp_path: Path, sig: int) -> None:
    gateway = GatewayProcess(tmp_path / "data").start()
    stopped_log = ""
    try:
        _publish(gateway.url, 0, 300)
        # Consume 100 with acks, leave 50 delivered but unacked, then stop.
        conn = pika.BlockingConnection(pika.URLParameters(gateway.url))
        ch = conn.channel()
        ch.basic_qos(prefetch_count=150)
        acked = []
        unacked = []
        for method, _props, body in ch.consume("durable_q", inactivity_timeout=2):
            assert method is not None
            if len(acked) < 100:
                ch.basic_ack(method.delivery_tag)
                acked.append(int(body))
            else:
                unacked.append(int(body))
            if len(acked) + len(unacked) == 150:
                break
        if sig == signal.SIGKILL:
            # Acks become durable when the gateway commits them (1 s) and the store persists
            # offsets (5 s): wait until that has happened, then kill.
            offsets = tmp_path / "data" / "store" / "offsets.json"
            check_for(15, lambda: offsets.exists() and '"1/0":100' in offsets.read_text())
        assert gateway.stop(sig) == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
        stopped_log = gateway.log()
        gateway.start()
        assert f"AMQP on 127.0.0.1:{gateway.amqp_port}" in gateway.log()
        after = _drain(gateway.url)
    finally:
        gateway.stop()
    assert acked == list(range(100))
    # Everything not acked comes back exactly once, in order.
    assert after == list(range(100, 300))
    if sig == signal.SIGTERM:
        assert "closing AMQP connection" in stopped_log
        assert "mqgw stopped cleanly" in stopped_log
