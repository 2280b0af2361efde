"""A queue with one consumer delivers what the consumer may take in a row as one run
(QueueRuntime._take_run, Session.deliver_run): exactly what one delivery at a time gives.

The same queue is pumped twice on real sessions, once in runs and once with every run cut
to one message and handed to Session.deliver (the consumer's room patched to 1: a choice, a
credit check and a delivery per message, as before runs), and everything a client or the
queue could tell apart is compared: the bytes the connection sends, the tags and unacked
deliveries, the consumer's and channel's counts, the session's backlog and writability, the
node's counters and the queue's state. Hypothesis varies prefetch (per consumer and per
channel), no-ack, the quota, the bodies (large ones fill the session's output mid-run and
take several frames) and what is already waiting to be sent.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, NamedTuple, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.amqp import ServerConnection
from gateway.observe.stats import NodeStats
from gateway.queues.runtime import PumpResult, QueueRuntime
from gateway.queues.scheduler import PushScheduler
from gateway.sessions.channel_state import ChannelState, Consumer
from gateway.sessions.session import HIGH_WATER_BYTES, Session
from meta.models import QueueDef
from storage import StoredMessage
from tests.gateway.amqp.helpers import handshake, open_channel
from tests.harness.clock import FakeClock


def _session() -> Session:
    clock = FakeClock()
    node = SimpleNamespace(
        scheduler=PushScheduler(clock=clock),
        name="n",
        stats=NodeStats(),
        next_connection_number=lambda: 1,
    )
    conn = handshake(ServerConnection())
    open_channel(conn, 1)
    return Session(cast(Any, node), conn, "127.0.0.1:1", "127.0.0.1:5672")


def _queue(sizes: list[int]) -> QueueRuntime:
    queue = QueueRuntime(QueueDef(vhost="/", name="q", queue_id=7), cast(Any, None))
    for offset, size in enumerate(sizes):
        body = memoryview(bytes([offset % 251]) * size)
        properties = memoryview(b"\0\0")
        message = StoredMessage(offset, 1000 + offset, b"", b"q", properties, body, 1, 2, 0)
        queue.buffer.append((0, message))
        queue.count_in(size)
    queue.cursors[0] = len(sizes)
    queue.exhausted = True
    return queue


class Case(NamedTuple):
    sizes: list[int]  # the bodies waiting in the queue
    no_ack: bool
    prefetch: int  # the consumer's
    prefetch_global: int  # the channel's
    quota: int  # per pump
    backlog: int  # bytes already waiting to be sent on the connection
    turns: int  # pumps


def subscribed(
    queue: QueueRuntime, no_ack: bool, prefetch: int, prefetch_global: int, backlog: int
) -> tuple[Session, ChannelState, Consumer]:
    """A real session with ``backlog`` bytes waiting to be sent, consuming ``queue`` on
    channel 1 (the channel's prefetch, and the consumer's)."""
    session = _session()
    session.pending_bytes = backlog
    channel = ChannelState(1, session)
    channel.prefetch_global = prefetch_global
    session.channels[1] = channel
    consumer = Consumer("ctag", channel, queue, no_ack, False, 0, prefetch)
    channel.consumers["ctag"] = consumer
    queue.add_consumer(consumer)
    return session, channel, consumer


def _pumped(case: Case) -> tuple[Any, ...]:
    queue = _queue(case.sizes)
    session, channel, _ = subscribed(
        queue, case.no_ack, case.prefetch, case.prefetch_global, case.backlog
    )
    results = [queue.pump(case.quota, 0.0) for _ in range(case.turns)]
    return results, observed(session, channel, queue)


def observed(session: Session, channel: ChannelState, queue: QueueRuntime) -> tuple[Any, ...]:
    """What a client or the queue could tell apart after deliveries: the bytes sent, the
    tags and unacked deliveries, the consumers' counts, the session's backlog and
    writability, the node's counters and the queue's state."""
    unacked = [(tag, d.partition, d.message.queue_offset) for tag, d in channel.unacked.items()]
    stats = session.node.stats
    return (
        session.conn.data_to_send(),
        unacked,
        channel.next_delivery_tag,
        [c.unacked for c in queue.consumers],
        session.pending_bytes,
        session.writable,
        session.dirty_marked,
        (stats.deliver, stats.deliver_no_ack, stats.redeliver),
        (queue.delivered, queue.ready_count, queue.ready_bytes, queue.commit_dirty),
        [(p, m.queue_offset) for p, m in queue.buffer],
        sorted((offset, p, m.queue_offset) for offset, p, m in queue.requeued),
        (sorted(queue.inflight[0]), queue.delivered_below[0], queue.choice._rr),
    )


def _one_by_one(session: Session, consumer: Consumer, queue: QueueRuntime, run: list[Any]) -> None:
    """Session.deliver for each: what a run replaces."""
    for partition, message, redelivered in run:
        session.deliver(consumer, queue, partition, message, redelivered)


cases = st.builds(
    Case,
    sizes=st.lists(
        st.one_of(st.integers(0, 300), st.integers(200_000, 1_500_000)), min_size=0, max_size=40
    ),
    no_ack=st.booleans(),
    prefetch=st.sampled_from([0, 1, 2, 5, 30]),
    prefetch_global=st.sampled_from([0, 1, 3, 25]),
    quota=st.sampled_from([1, 3, 64]),
    backlog=st.sampled_from([0, HIGH_WATER_BYTES // 2, HIGH_WATER_BYTES - 100, HIGH_WATER_BYTES]),
    turns=st.integers(1, 4),
)


@settings(max_examples=150, deadline=None)
@given(cases)
def test_runs_deliver_what_one_at_a_time_does(case: Case) -> None:
    in_runs = _pumped(case)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Consumer, "room", lambda self, most: min(1, most))
        patch.setattr(Session, "deliver_run", _one_by_one)
        one_at_a_time = _pumped(case)
    assert in_runs == one_at_a_time


def test_a_run_stops_at_the_message_that_fills_the_connections_output() -> None:
    """Three 2 MB bodies with a 4 MB backlog limit: the second one crosses it, so a run
    takes two (as one at a time, where the session stops being writable after it)."""
    big = 2 * 1024 * 1024
    result = _pumped(Case([big, big, big], True, 0, 0, 64, 0, 1))
    results, seen = result
    assert results == [PumpResult.NO_CREDIT]
    assert len(seen[9]) == 1 and seen[5] is False  # one left, the session not writable


def test_a_run_stops_at_the_consumers_prefetch() -> None:
    result = _pumped(Case([10] * 8, False, 3, 0, 64, 0, 1))
    results, seen = result
    assert [tag for tag, _, _ in seen[1]] == [1, 2, 3]
    assert results == [PumpResult.NO_CREDIT] and len(seen[9]) == 5
