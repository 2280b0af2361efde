"""The redelivered flag across a restart of the embedded node, as RabbitMQ sets it: a message
delivered and left unacked when the node stopped comes back with redelivered=True, whether
the node was stopped with SIGTERM or killed; one never delivered comes back False after a
clean stop. (After a SIGTERM mqgw said False: only a crash left marks of what may have gone
out, and the clean stop requeued the delivery before its offsets were committed.)"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.harness.processes import GatewayProcess

QUEUE = "flagged"
PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    process = GatewayProcess(tmp_path / "data", [])
    process.start()
    yield process
    process.kill()


def publish_three_get_one(gateway: GatewayProcess) -> pika.BlockingConnection:
    """Three persistent messages; the first got and left unacked (the connection stays)."""
    connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
    channel = connection.channel()
    channel.queue_declare(QUEUE, durable=True)
    channel.confirm_delivery()
    for n in range(3):
        channel.basic_publish("", QUEUE, b"%d" % n, PERSISTENT)
    method, _, body = channel.basic_get(QUEUE)
    assert method is not None and (body, method.redelivered) == (b"0", False)
    return connection


def get_all(gateway: GatewayProcess) -> list[tuple[bytes, bool]]:
    connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
    channel = connection.channel()
    got: list[tuple[bytes, bool]] = []
    while True:
        method, _, body = channel.basic_get(QUEUE, auto_ack=True)
        if method is None:
            break
        got.append((body, bool(method.redelivered)))
    connection.close()
    return got


def test_an_unacked_delivery_comes_back_redelivered_after_a_clean_restart(
    gateway: GatewayProcess,
) -> None:
    publish_three_get_one(gateway)
    assert gateway.stop() == 0  # SIGTERM with the delivery still out
    gateway.start()
    assert get_all(gateway) == [(b"0", True), (b"1", False), (b"2", False)]  # (b"0", False)


def test_two_clean_restarts_keep_the_flag(gateway: GatewayProcess) -> None:
    """Not delivered again in between: still a message that went out before."""
    publish_three_get_one(gateway)
    assert gateway.stop() == 0
    gateway.start()
    # A round trip first: the node takes SIGTERM once it serves (its ready line comes first).
    pika.BlockingConnection(pika.URLParameters(gateway.url)).close()
    assert gateway.stop() == 0
    gateway.start()
    assert get_all(gateway) == [(b"0", True), (b"1", False), (b"2", False)]


def test_an_unacked_delivery_comes_back_redelivered_after_kill_9(
    gateway: GatewayProcess,
) -> None:
    publish_three_get_one(gateway)
    gateway.stop(signal.SIGKILL)
    gateway.start()
    # After a crash what may have gone out is not known: everything stored is flagged.
    got = get_all(gateway)
    assert [body for body, _ in got] == [b"0", b"1", b"2"] and got[0][1]
