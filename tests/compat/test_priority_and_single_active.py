"""Priority queues and single active consumer with a real gateway and real pika clients:
fail-over when the active consumer's process is killed (SIGKILL: its connection just drops),
and priority order surviving a gateway restart (the index is rebuilt from the log)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pika
import pytest

from bench.servers import free_port
from tests.harness.processes import GatewayProcess, check_for, die_with_parent

QUEUE = "work"
ACTIVE = textwrap.dedent(
    """
    import sys
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(sys.argv[1]))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=5)
    for method, _props, body in ch.consume("work", consumer_tag="active"):
        number = int(body)
        if number < 10:  # acks the first ten, then holds five unacked until killed
            ch.basic_ack(method.delivery_tag)
        print(number, flush=True)
    """
)


def _publish(url: str, bodies: list[tuple[int, int | None]], queue_args: dict) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.confirm_delivery()
    ch.queue_declare(QUEUE, durable=True, arguments=queue_args)
    for number, priority in bodies:
        properties = pika.BasicProperties(delivery_mode=2, priority=priority)
        ch.basic_publish("", QUEUE, b"%d" % number, properties)
    conn.close()


def _queue(gateway: GatewayProcess) -> dict:
    status, queue = gateway.admin("GET", f"/api/queues/%2F/{QUEUE}")
    assert status == 200, queue
    return queue  # type: ignore[no-any-return]


def test_single_active_consumer_fails_over_when_its_process_is_killed(tmp_path: Path) -> None:
    gateway = GatewayProcess(tmp_path / "data", ["--admin-port", str(free_port())]).start()
    active = None
    try:
        _publish(gateway.url, [], {"x-single-active-consumer": True})
        active = subprocess.Popen(
            [sys.executable, "-c", ACTIVE, gateway.url],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=die_with_parent,
        )
        check_for(10, lambda: _queue(gateway)["consumers"] == 1 or None)
        # The standby subscribes second: it waits while the active one lives.
        conn = pika.BlockingConnection(pika.URLParameters(gateway.url))
        ch = conn.channel()
        received: list[tuple[int, bool]] = []

        def on_message(channel: object, method: object, _props: object, body: bytes) -> None:
            received.append((int(body), method.redelivered))  # type: ignore[attr-defined]
            ch.basic_ack(method.delivery_tag)  # type: ignore[attr-defined]

        ch.basic_consume(QUEUE, on_message, consumer_tag="standby")
        queue = _queue(gateway)
        assert queue["single_active_consumer_tag"] == "active"
        assert {c["consumer_tag"]: c["activity_status"] for c in queue["consumer_details"]} == {
            "active": "single_active",
            "standby": "waiting",
        }
        _publish(gateway.url, [(n, None) for n in range(40)], {"x-single-active-consumer": True})
        assert active.stdout is not None
        seen = [int(active.stdout.readline()) for _ in range(15)]
        conn.process_data_events(0.5)
        assert seen == list(range(15)) and received == []  # 10 acked, 5 held unacked
        active.send_signal(signal.SIGKILL)
        active.wait()
        deadline = time.monotonic() + 15
        while len(received) < 30 and time.monotonic() < deadline:
            conn.process_data_events(0.05)
        queue = _queue(gateway)
        conn.close()
    finally:
        if active is not None and active.poll() is None:
            active.kill()
        gateway.stop()
    # What the killed consumer held comes first, redelivered; then the rest in order.
    assert received == [(n, True) for n in range(10, 15)] + [(n, False) for n in range(15, 40)]
    assert queue["single_active_consumer_tag"] == "standby"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_priority_order_survives_a_restart(tmp_path: Path, sig: int) -> None:
    gateway = GatewayProcess(tmp_path / "data").start()
    priorities = [n % 4 if n % 5 else None for n in range(400)]
    try:
        _publish(gateway.url, list(enumerate(priorities)), {"x-max-priority": 3})
        assert gateway.stop(sig) == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
        gateway.start()
        conn = pika.BlockingConnection(pika.URLParameters(gateway.url))
        ch = conn.channel()
        got = []
        while (reply := ch.basic_get(QUEUE, auto_ack=True))[0] is not None:
            got.append(int(reply[2]))
        conn.close()
    finally:
        gateway.stop()
    level = [p or 0 for p in priorities]
    assert got == sorted(range(400), key=lambda n: (-level[n], n))
