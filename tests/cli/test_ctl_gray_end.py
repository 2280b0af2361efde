"""`mqgw ctl gray end|resume` as operators run them, against a real gateway with real
clients: a gray publisher's messages wait in a queue's gray partitions, out of a normal
consumer's reach; ending gray release hands them to that consumer, and the command waits
(printing what is left) until they are drained; resuming gives the queue its gray partitions
back."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from localcluster.ports import free_port
from tests.cli.commands import clean_env, mqgw
from tests.harness.processes import GatewayProcess

ARGUMENTS = {"x-mqgw-partitions": 4, "x-mqgw-gray-partitions": 2}
PROGRESS = re.compile(
    r"waiting \(\d+\.\d s\): left (\d+) \(partition 0: (\d+), partition 3: (\d+)\)"
)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    process = GatewayProcess(tmp_path / "data", ["--admin-port", str(free_port())]).start()
    yield process
    process.stop()


def _ctl(gateway: GatewayProcess, home: Path, *args: str) -> tuple[int, str, str]:
    url = f"http://127.0.0.1:{gateway.admin_port}"
    env = clean_env(home, MQGW_ADMIN_URL=url, MQGW_ADMIN_USER="guest", MQGW_ADMIN_PASSWORD="guest")
    done = mqgw("ctl", "gray", *args, env=env)
    return done.returncode, done.stdout, done.stderr.strip()


def _gray(gateway: GatewayProcess, queue: str = "orders") -> dict[str, Any]:
    status, body = gateway.admin("GET", f"/api/gray/queues/%2F/{queue}")
    assert status == 200, body
    return dict(body)


def _connect(gateway: GatewayProcess, name: str, gray: bool | None) -> pika.BlockingConnection:
    params = pika.URLParameters(gateway.url)
    properties: dict[str, Any] = {"connection_name": name}
    if gray is not None:
        properties["mqgw-gray"] = gray
    params.client_properties = properties
    return pika.BlockingConnection(params)


def _publish_gray(gateway: GatewayProcess, count: int) -> None:
    with _connect(gateway, "canary-publisher", gray=True) as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        for n in range(count):
            properties = pika.BasicProperties(delivery_mode=2)
            channel.basic_publish("", "orders", f"gray:{n}".encode(), properties)


def _consume(gateway: GatewayProcess, want: int, timeout_s: float = 20) -> list[str]:
    """A normal consumer takes and acks ``want`` messages (fewer if none come for a while)."""
    got: list[str] = []
    with _connect(gateway, "fleet", gray=None) as conn:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=50)
        for method, _properties, body in channel.consume("orders", inactivity_timeout=timeout_s):
            if method is None:
                break
            got.append(body.decode())
            channel.basic_ack(method.delivery_tag)
            if len(got) >= want:
                break
        channel.cancel()
    return got


def test_end_hands_the_gray_messages_to_normal_consumers_and_waits_for_the_drain(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    with _connect(gateway, "setup", gray=None) as conn:
        channel = conn.channel()
        channel.queue_declare("orders", durable=True, arguments=ARGUMENTS)
        channel.queue_declare("plain", durable=True, arguments={"x-mqgw-partitions": 4})
    _publish_gray(gateway, 30)
    with _connect(gateway, "fleet", gray=None) as conn:  # normal: the gray lane is not its
        assert conn.channel().basic_get("orders") == (None, None, None)
    assert _gray(gateway)["gray_now"] == [0, 3]

    assert _ctl(gateway, tmp_path, "end", "orders", "--no-wait") == (
        0,
        "",
        "gray release of queue 'orders': ended (gray partitions 0, 3)",
    )
    shown = _gray(gateway)
    assert (shown["ended"], shown["gray_now"], shown["status"]["left"]) == (True, [], 30)

    # Nobody reads them yet: waiting gives up after the timeout, printing what is left.
    code, out, text = _ctl(gateway, tmp_path, "end", "orders", "--timeout", "1")
    assert code == 1
    assert text.splitlines() == [
        "gray release of queue 'orders': had ended already (gray partitions 0, 3)",
        "mqgw ctl gray end: queue 'orders' still has 30 message(s) from before the end in"
        " its former gray partitions after 1 s (gray release stays ended: every consumer"
        " reads them)",
    ]
    lines = out.splitlines()
    assert 2 <= len(lines) <= 4, out
    for line in lines:
        progress = PROGRESS.fullmatch(line)
        assert progress is not None, line
        left, first, last = (int(n) for n in progress.groups())
        assert left == first + last == 30, line

    got = _consume(gateway, 30)
    assert sorted(got) == sorted(f"gray:{n}" for n in range(30))
    code, out, text = _ctl(gateway, tmp_path, "end", "orders")
    assert code == 0, text
    summary = out.splitlines()[-1]
    assert summary.startswith("gray release of queue 'orders' ended; its gray partitions drained")
    assert re.fullmatch(r".* drained in \d+\.\d s", summary), summary
    assert _gray(gateway)["status"]["left"] == 0

    assert _ctl(gateway, tmp_path, "resume", "orders") == (
        0,
        "",
        "gray release of queue 'orders': resumed",
    )
    shown = _gray(gateway)
    assert (shown["ended"], shown["gray_now"], shown["status"]) == (False, [0, 3], None)
    code, _, text = _ctl(gateway, tmp_path, "resume", "orders")
    assert code == 1 and "answered 404 gray release of queue 'orders'" in text, text
    assert text.endswith("has not ended"), text

    code, _, text = _ctl(gateway, tmp_path, "end", "plain")
    assert code == 1 and "answered 400 queue 'plain' in vhost '/' has no gray partitions" in text
    code, _, text = _ctl(gateway, tmp_path, "end", "orders", "--vhost", "other")
    assert code == 1 and "answered 404 no vhost 'other'" in text, text
