"""A queue's counts after the embedded node restarts, cleanly or killed: what RabbitMQ shows
for a durable queue (5 persistent messages published, 2 got, 1 of them acked, the node
restarted) is 4 ready, 0 unacknowledged, 4 messages, since the delivery left unacked by the
connection the restart closed comes back ready. /api/queues, /api/vhosts, /api/overview,
/metrics and /metrics/per-object must all say so: depth alerts and the RabbitMQ-Overview
Grafana board read them. (The unacked figure was derived from counters a restart does not
restore: -4 unacked and 0 messages with 4 ready.)"""

from __future__ import annotations

import base64
import json
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from prometheus_client.parser import text_string_to_metric_families

from localcluster.ports import free_port
from tests.harness.processes import GatewayProcess

QUEUE = "counted"
PERSISTENT = pika.BasicProperties(delivery_mode=2)

Counts = tuple[int, int, int]  # (messages_ready, messages_unacknowledged, messages)


class Admin:
    """The admin API of a gateway whose port may change between restarts."""

    def __init__(self, port: Callable[[], int]) -> None:
        self.port = port

    def get(self, path: str) -> bytes:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port()}{path}")
        request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        with urllib.request.urlopen(request, timeout=30) as response:
            return bytes(response.read())

    def json(self, path: str) -> Any:
        return json.loads(self.get(path))

    def metrics(self, path: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(self.get(path).decode())
            for sample in family.samples
        }


def _triple(body: dict[str, Any]) -> Counts:
    keys = ("messages_ready", "messages_unacknowledged", "messages")
    ready, unacked, messages = (int(body[key]) for key in keys)
    return ready, unacked, messages


def counts(admin: Admin, queue: str, whole_node: bool = True) -> dict[str, Counts]:
    """The queue's counts as each view gives them. ``whole_node``: the node holds this
    queue's messages alone, so the vhost, overview and /metrics totals are its counts too."""
    rows = [row for row in admin.json("/api/queues") if row["name"] == queue]
    seen = {"/api/queues": _triple(rows[0])}
    per_object = admin.metrics("/metrics/per-object")
    labels = (("queue", queue), ("vhost", "/"))
    seen["/metrics/per-object"] = (
        int(per_object[("rabbitmq_queue_messages_ready", labels)]),
        int(per_object[("rabbitmq_queue_messages_unacked", labels)]),
        int(per_object[("rabbitmq_queue_messages", labels)]),
    )
    if whole_node:
        seen["/api/vhosts/%2F"] = _triple(admin.json("/api/vhosts/%2F"))
        seen["/api/overview"] = _triple(admin.json("/api/overview")["queue_totals"])
        totals = admin.metrics("/metrics")
        seen["/metrics"] = (
            int(totals[("rabbitmq_queue_messages_ready", ())]),
            int(totals[("rabbitmq_queue_messages_unacked", ())]),
            int(totals[("rabbitmq_queue_messages", ())]),
        )
    return seen


def wait_for_counts(
    admin: Admin, queue: str, expected: Counts, whole_node: bool = True, timeout_s: float = 10
) -> None:
    """Every view gives ``expected`` before the deadline (the figures the node computes at
    a request; a poll only rides over the moment the restart's start-up is still reading)."""
    deadline = time.monotonic() + timeout_s
    seen: dict[str, Counts] | str = "nothing yet"
    while time.monotonic() < deadline:
        try:
            seen = counts(admin, queue, whole_node)
        except (OSError, KeyError, IndexError) as error:  # still starting
            seen = repr(error)
        else:
            if all(value == expected for value in seen.values()):
                return
        time.sleep(0.05)
    raise AssertionError(f"expected (ready, unacked, messages) = {expected}, got {seen}")


def stored_offset_is(data_dir: Path, offset: int) -> bool:
    """The queue's committed offset has reached offsets.json (what a kill -9 keeps); the
    test's queue is the only one with a committed offset there."""
    try:
        document = json.loads((data_dir / "store" / "offsets.json").read_text())
    except (OSError, ValueError):
        return False
    return offset in document.get("groups", {}).get("$queue", {}).values()


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    # Offsets written every 50 ms, so a kill -9 test need not wait the default 5 s for them.
    env = {"MQGW_OFFSET_PERSIST_INTERVAL_MS": "50"}
    process = GatewayProcess(tmp_path / "data", ["--admin-port", str(free_port())], env=env)
    process.start()
    yield process
    process.kill()


def publish_five_get_two_ack_one(gateway: GatewayProcess, admin: Admin) -> pika.BlockingConnection:
    """The issue's steps; the connection stays open, its unacked delivery with it."""
    connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
    channel = connection.channel()
    channel.queue_declare(QUEUE, durable=True)
    channel.confirm_delivery()
    for n in range(5):
        channel.basic_publish("", QUEUE, b"%d" % n, PERSISTENT)
    first, _, _ = channel.basic_get(QUEUE)
    second, _, _ = channel.basic_get(QUEUE)
    assert first is not None and second is not None
    channel.basic_ack(first.delivery_tag)
    wait_for_counts(admin, QUEUE, (3, 1, 4))
    return connection


def get_and_ack_after_restart(gateway: GatewayProcess, admin: Admin) -> None:
    """After the restart, the counts follow new deliveries and acks from there."""
    connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
    channel = connection.channel()
    method, _, body = channel.basic_get(QUEUE)
    assert method is not None and body == b"1"  # the one left unacked comes first
    wait_for_counts(admin, QUEUE, (3, 1, 4))
    channel.basic_ack(method.delivery_tag)
    wait_for_counts(admin, QUEUE, (3, 0, 3))
    connection.close()


def test_counts_after_a_clean_restart(gateway: GatewayProcess) -> None:
    admin = Admin(lambda: gateway.admin_port)
    publish_five_get_two_ack_one(gateway, admin)
    assert gateway.stop() == 0  # SIGTERM with the client still connected
    gateway.start()
    wait_for_counts(admin, QUEUE, (4, 0, 4))
    get_and_ack_after_restart(gateway, admin)


def test_counts_after_kill_9(gateway: GatewayProcess) -> None:
    admin = Admin(lambda: gateway.admin_port)
    publish_five_get_two_ack_one(gateway, admin)
    # The ack is on disk before the crash (else the first message comes back too, as
    # at-least-once allows, and 5 ready would be right).
    deadline = time.monotonic() + 10
    while not stored_offset_is(gateway.data_dir, 1):
        assert time.monotonic() < deadline, "the committed offset never reached offsets.json"
        time.sleep(0.02)
    gateway.stop(signal.SIGKILL)
    gateway.start()
    wait_for_counts(admin, QUEUE, (4, 0, 4))
    get_and_ack_after_restart(gateway, admin)


def test_transient_messages_are_not_counted_after_a_restart(gateway: GatewayProcess) -> None:
    """RabbitMQ loses a durable queue's transient messages when it restarts, and mqgw skips
    them at delivery; its count after the start said 3 ready until a get passed them."""
    admin = Admin(lambda: gateway.admin_port)
    connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
    channel = connection.channel()
    channel.queue_declare(QUEUE, durable=True)
    channel.confirm_delivery()
    channel.basic_publish("", QUEUE, b"transient 1")
    channel.basic_publish("", QUEUE, b"persistent", PERSISTENT)
    channel.basic_publish("", QUEUE, b"transient 2")
    connection.close()
    wait_for_counts(admin, QUEUE, (3, 0, 3))
    assert gateway.stop() == 0
    gateway.start()
    wait_for_counts(admin, QUEUE, (1, 0, 1))  # was (3, 0, 3)
    connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
    channel = connection.channel()
    method, _, body = channel.basic_get(QUEUE, auto_ack=True)
    assert method is not None and body == b"persistent"
    assert channel.basic_get(QUEUE)[0] is None
    wait_for_counts(admin, QUEUE, (0, 0, 0))
    connection.close()
