"""Broadcast queues (x-consume-mode: broadcast) with pika, unchanged, against a real gateway:
every consumer gets every message from its own position; acks, requeues and prefetch are per
consumer; a named consumer resumes where it acked, across reconnects and a restart."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from pika.adapters.blocking_connection import BlockingChannel

from tests.harness.processes import GatewayProcess

BROADCAST = {"x-consume-mode": "broadcast"}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """One gateway for the module: each test uses its own queue."""
    process = GatewayProcess(tmp_path_factory.mktemp("broadcast") / "data").start()
    yield process
    process.stop()


def _connect(gateway: GatewayProcess, name: str | None = None) -> pika.BlockingConnection:
    params = pika.URLParameters(gateway.url)
    if name is not None:
        params.client_properties = {"connection_name": name}
    return pika.BlockingConnection(params)


def _publish(gateway: GatewayProcess, queue: str, bodies: range) -> None:
    conn = _connect(gateway)
    ch = conn.channel()
    ch.confirm_delivery()
    for i in bodies:
        ch.basic_publish("", queue, b"%d" % i, pika.BasicProperties(delivery_mode=2))
    conn.close()


class Inbox:
    """A consumer (basic.consume returns once consume-ok arrived) and what it received."""

    def __init__(
        self, ch: BlockingChannel, queue: str, tag: str, ack: bool = True, no_ack: bool = False
    ) -> None:
        self.ch = ch
        self.ack = ack and not no_ack
        self.got: list[tuple[int, bool]] = []  # (body, redelivered)
        self.tags: list[int] = []
        ch.basic_consume(queue, self._on_message, auto_ack=no_ack, consumer_tag=tag)

    def _on_message(self, ch: BlockingChannel, method: Any, _props: Any, body: bytes) -> None:
        self.got.append((int(body), method.redelivered))
        self.tags.append(method.delivery_tag)
        if self.ack:
            ch.basic_ack(method.delivery_tag)

    def wait(self, count: int, timeout_s: float = 10) -> list[int]:
        """Bodies, once at least ``count`` deliveries arrived (fails after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while len(self.got) < count:
            assert time.monotonic() < deadline, f"only {self.got} arrived"
            self.ch.connection.process_data_events(time_limit=0.05)
        return [body for body, _ in self.got]


def test_every_consumer_gets_every_message_in_order(gateway: GatewayProcess) -> None:
    conn = _connect(gateway)
    channels = [conn.channel() for _ in range(3)]
    channels[0].queue_declare("bq_all", durable=True, arguments=BROADCAST)
    _publish(gateway, "bq_all", range(20))  # before anyone subscribed: nobody's
    inboxes = []
    for number, ch in enumerate(channels):
        ch.basic_qos(prefetch_count=7)
        inboxes.append(Inbox(ch, "bq_all", f"c{number}"))
    declared = channels[0].queue_declare("bq_all", passive=True).method
    assert (declared.message_count, declared.consumer_count) == (0, 3)
    _publish(gateway, "bq_all", range(20, 220))
    for inbox in inboxes:
        assert inbox.wait(200) == list(range(20, 220))
    assert channels[0].queue_declare("bq_all", passive=True).method.message_count == 0
    conn.close()


def test_nack_requeue_goes_back_to_that_consumer_only(gateway: GatewayProcess) -> None:
    conn = _connect(gateway)
    a_ch, b_ch = conn.channel(), conn.channel()
    a_ch.queue_declare("bq_nack", arguments=BROADCAST)
    for ch in (a_ch, b_ch):
        ch.basic_qos(prefetch_count=1)
    a = Inbox(a_ch, "bq_nack", "a", ack=False)
    b = Inbox(b_ch, "bq_nack", "b")
    _publish(gateway, "bq_nack", range(3))
    a.wait(1)
    a_ch.basic_nack(a.tags[0], requeue=True)
    for count in (2, 3, 4):
        a.wait(count)
        a_ch.basic_ack(a.tags[-1])
    assert a.got == [(0, False), (0, True), (1, False), (2, False)]
    b.wait(3)
    assert b.got == [(0, False), (1, False), (2, False)]
    conn.close()


def test_prefetch_holds_per_consumer(gateway: GatewayProcess) -> None:
    conn = _connect(gateway)
    slow_ch, fast_ch, other = conn.channel(), conn.channel(), conn.channel()
    slow_ch.queue_declare("bq_prefetch", arguments=BROADCAST)
    slow_ch.basic_qos(prefetch_count=2)
    slow = Inbox(slow_ch, "bq_prefetch", "slow", ack=False)
    fast = Inbox(fast_ch, "bq_prefetch", "fast", no_ack=True)
    _publish(gateway, "bq_prefetch", range(10))
    assert fast.wait(10) == list(range(10))
    assert slow.wait(2) == [0, 1]
    # The furthest-behind consumer is the slow one: 2 unacked, 8 still waiting for it.
    assert other.queue_declare("bq_prefetch", passive=True).method.message_count == 8
    slow_ch.basic_ack(slow.tags[1], multiple=True)
    assert slow.wait(4) == [0, 1, 2, 3]
    assert other.queue_declare("bq_prefetch", passive=True).method.message_count == 6
    conn.close()


def test_a_named_consumer_resumes_where_it_acked(gateway: GatewayProcess) -> None:
    setup = _connect(gateway)
    setup.channel().queue_declare("bq_resume", durable=True, arguments=BROADCAST)
    setup.close()
    conn = _connect(gateway, "billing-1")
    ch = conn.channel()
    first = Inbox(ch, "bq_resume", "audit", ack=False)
    _publish(gateway, "bq_resume", range(10))
    assert first.wait(10) == list(range(10))
    for tag in first.tags[:4]:  # 0..3 acked; 4..9 unacked go back at the close
        ch.basic_ack(tag)
    conn.close()
    _publish(gateway, "bq_resume", range(10, 15))  # while it is away
    conn = _connect(gateway, "billing-1")
    again = Inbox(conn.channel(), "bq_resume", "audit")
    assert again.wait(11) == list(range(4, 15))
    # Another connection name is another consumer: it starts at the end.
    other = _connect(gateway, "billing-2")
    fresh = Inbox(other.channel(), "bq_resume", "audit")
    _publish(gateway, "bq_resume", range(15, 16))
    assert fresh.wait(1) == [15]
    assert again.wait(12) == [*range(4, 15), 15]
    other.close()
    conn.close()


def test_one_position_serves_one_consumer_at_a_time(gateway: GatewayProcess) -> None:
    first = _connect(gateway, "dup")
    first_ch = first.channel()
    first_ch.queue_declare("bq_dup", arguments=BROADCAST)
    Inbox(first_ch, "bq_dup", "c")
    second = _connect(gateway, "dup")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        Inbox(second.channel(), "bq_dup", "c")
    assert info.value.reply_code == 403
    assert "broadcast position 'broadcast:dup:c' is in use" in info.value.reply_text
    first.close()
    Inbox(second.channel(), "bq_dup", "c")  # free again once the first one left
    second.close()


def test_queue_lifecycle_counts_every_broadcast_consumer(gateway: GatewayProcess) -> None:
    conn = _connect(gateway)
    a_ch, b_ch, admin = conn.channel(), conn.channel(), conn.channel()
    a_ch.queue_declare("bq_auto", auto_delete=True, arguments=BROADCAST)
    Inbox(a_ch, "bq_auto", "a")
    Inbox(b_ch, "bq_auto", "b")
    a_ch.basic_cancel("a")  # not the last consumer: the auto-delete queue stays
    assert admin.queue_declare("bq_auto", passive=True).method.consumer_count == 1
    b_ch.basic_cancel("b")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        admin.queue_declare("bq_auto", passive=True)
    assert info.value.reply_code == 404
    # Deleting a broadcast queue cancels its consumers (consumer_cancel_notify).
    c_ch, admin = conn.channel(), conn.channel()
    c_ch.queue_declare("bq_gone", arguments=BROADCAST)
    Inbox(c_ch, "bq_gone", "c")
    assert admin.queue_delete("bq_gone", if_unused=False).method.message_count == 0
    deadline = time.monotonic() + 10
    while c_ch.consumer_tags:
        assert time.monotonic() < deadline, "no basic.cancel from the broker"
        conn.process_data_events(time_limit=0.05)
    conn.close()


@pytest.mark.parametrize(
    ("value", "problem"),
    [("fanout", "invalid_consume_mode"), (3, "{unacceptable_type,signedint}")],
)
def test_an_invalid_consume_mode_is_refused_with_406(
    gateway: GatewayProcess, value: object, problem: str
) -> None:
    conn = _connect(gateway)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        conn.channel().queue_declare("bq_bad", arguments={"x-consume-mode": value})
    assert (info.value.reply_code, info.value.reply_text) == (
        406,
        "PRECONDITION_FAILED - invalid arg 'x-consume-mode' for queue 'bq_bad' in vhost '/': "
        + problem,
    )
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        conn.channel().queue_declare("bq_bad", passive=True)
    assert info.value.reply_code == 404  # nothing was declared
    conn.close()


def test_positions_survive_a_restart(tmp_path: Path) -> None:
    gateway = GatewayProcess(tmp_path / "data").start()
    try:
        conn = _connect(gateway, "reports")
        ch = conn.channel()
        ch.queue_declare("bq_restart", durable=True, arguments=BROADCAST)
        inbox = Inbox(ch, "bq_restart", "daily", ack=False)
        _publish(gateway, "bq_restart", range(10))
        inbox.wait(10)
        ch.basic_ack(inbox.tags[5], multiple=True)  # 0..5
        ch.queue_declare("bq_restart", passive=True)  # a round trip: the ack was handled
        # Stopped within the housekeeping's commit interval: the shutdown commits it.
        assert gateway.stop(signal.SIGTERM) == 0
        gateway.start()
        _publish(gateway, "bq_restart", range(10, 12))
        conn = _connect(gateway, "reports")
        got = Inbox(conn.channel(), "bq_restart", "daily").wait(6)
        conn.close()
    finally:
        gateway.stop()
    assert got == list(range(6, 12))
