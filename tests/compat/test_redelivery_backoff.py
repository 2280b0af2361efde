"""Redelivery backoff on a real gateway with a scaled-down ladder (100, 200, 400 ms):
nacked messages come back after each step (never before it), counted in x-delivery-count and
flagged redelivered; past x-max-redeliveries they land in <queue>.dlq, from which
`mqgw queue redrive` moves them back. A backoff survives a SIGKILL."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pika

from bench.servers import free_port
from tests.harness.processes import GatewayProcess, check_for

LADDER_MS = [100, 200, 400]
ENV = {
    "MQGW_TIMER_LEVELS_MS": json.dumps([0, *LADDER_MS, 3000]),
    "MQGW_REDELIVERY_LADDER_MS": json.dumps(LADDER_MS),
}
BACKOFF = {"x-redelivery": "backoff", "x-max-redeliveries": 3}


def _gateway(data: Path, ladder: list[int] | None = None) -> GatewayProcess:
    env = dict(ENV)
    if ladder is not None:
        env["MQGW_REDELIVERY_LADDER_MS"] = json.dumps(ladder)
    return GatewayProcess(data, ["--admin-port", str(free_port())], env=env)


def _queue_stats(gateway: GatewayProcess, name: str) -> dict[str, Any]:
    status, stats = gateway.admin("GET", f"/api/queues/%2F/{name}")
    assert status == 200, stats
    return dict(stats)


def _nack_until_dead(ch: Any, queue: str) -> list[tuple[float, bool, int | None]]:
    """Nack (requeue) every delivery; (arrival time, redelivered, x-delivery-count) each."""
    arrivals = []
    for method, props, _body in ch.consume(queue, inactivity_timeout=2):
        if method is None:
            break
        count = (props.headers or {}).get("x-delivery-count")
        arrivals.append((time.monotonic(), method.redelivered, count))
        ch.basic_nack(method.delivery_tag, requeue=True)
    ch.cancel()
    return arrivals


def test_backoff_ladder_then_dead_letter_queue_then_redrive(tmp_path: Path) -> None:
    gateway = _gateway(tmp_path / "data").start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(gateway.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("work", durable=True, arguments=BACKOFF)
        ch.basic_publish("", "work", b"job", pika.BasicProperties(delivery_mode=2))
        arrivals = _nack_until_dead(ch, "work")
        assert [(r, c) for _, r, c in arrivals] == [(False, None), (True, 1), (True, 2), (True, 3)]
        gaps_ms = [(b[0] - a[0]) * 1000 for a, b in itertools.pairwise(arrivals)]
        for gap, step in zip(gaps_ms, LADDER_MS, strict=True):
            assert gap >= step  # never early
        # The fourth nack passed x-max-redeliveries: into work.dlq, with its history.
        # (polled through the admin API: a passive declare of a missing queue closes the channel)
        dead = check_for(5, lambda: _queue_stats(gateway, "work.dlq")["messages_ready"])
        assert dead == 1
        _, props, body = ch.basic_get("work.dlq", auto_ack=True)
        assert body == b"job"
        death = props.headers["x-death"][0]
        assert (death["reason"], death["queue"], death["count"]) == ("delivery_limit", "work", 1)
        assert props.headers["x-delivery-count"] == 3
        stats = _queue_stats(gateway, "work")["mqgw"]
        assert (stats["retried"], stats["dead_lettered"]) == (3, 1)
        status, timer = gateway.admin("GET", "/api/timer")
        assert status == 200, timer
        assert timer["redelivery"] == {"scheduled": 3, "returned": 3, "dropped": 0}
        assert timer["pending"] == 0 and timer["fired"] == 3

        # Another one dies, then `mqgw queue redrive` brings it back, count reset.
        ch.basic_publish("", "work", b"again", pika.BasicProperties(delivery_mode=2))
        _nack_until_dead(ch, "work")
        check_for(5, lambda: _queue_stats(gateway, "work.dlq")["messages_ready"])
        admin = f"http://127.0.0.1:{gateway.admin_port}"
        result = subprocess.run(
            [sys.executable, "-m", "mqgw_cli.main", "queue", "redrive", "work", "--admin", admin],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["moved"] == 1
        assert "1 moved, 0 left" in result.stderr
        _, props, body = ch.basic_get("work", auto_ack=True)
        assert body == b"again"
        assert "x-delivery-count" not in props.headers
        assert props.headers["x-death"][0]["reason"] == "delivery_limit"
        assert ch.queue_declare("work.dlq", passive=True).method.message_count == 0
        conn.close()
    finally:
        gateway.stop()


def test_a_closing_channel_returns_messages_at_once(tmp_path: Path) -> None:
    gateway = _gateway(tmp_path / "data", ladder=[3000]).start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(gateway.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("work", arguments=BACKOFF)
        ch.basic_publish("", "work", b"held")
        consumer = conn.channel()
        method, _, _ = consumer.basic_get("work")
        consumer.close()  # not a nack: no backoff
        method, _, body = ch.basic_get("work", auto_ack=True)
        assert (body, method.redelivered) == (b"held", True)
        conn.close()
    finally:
        gateway.stop()


def test_a_backoff_survives_sigkill(tmp_path: Path) -> None:
    gateway = _gateway(tmp_path / "data", ladder=[3000]).start()
    conn = pika.BlockingConnection(pika.URLParameters(gateway.url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare("work", durable=True, arguments=BACKOFF)
    ch.basic_publish("", "work", b"wait", pika.BasicProperties(delivery_mode=2))
    method, _, _ = ch.basic_get("work")
    nacked_at = time.monotonic()
    ch.basic_nack(method.delivery_tag, requeue=True)
    # Once its timer record is stored (sync flush: on disk) the queue lets the message go.
    check_for(5, lambda: _queue_stats(gateway, "work")["mqgw"]["retried"] == 1)
    gateway.stop(signal.SIGKILL)
    gateway.start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(gateway.url))
        ch = conn.channel()
        got = []
        for method, props, body in ch.consume("work", inactivity_timeout=8):
            if method is None:
                break
            count = (props.headers or {}).get("x-delivery-count")
            got.append((body, count, time.monotonic() - nacked_at))
            ch.basic_ack(method.delivery_tag)
            if count == 1:
                break
        # The backed-off copy comes back after its step. (The nack's settlement may not have
        # been committed before the kill: then the message is also redelivered at once,
        # at-least-once, as an unacked message is.)
        assert got and got[-1][:2] == (b"wait", 1)
        assert got[-1][2] >= 3.0
        assert all(body == b"wait" and count in (None, 1) for body, count, _ in got)
        conn.close()
    finally:
        gateway.stop()
