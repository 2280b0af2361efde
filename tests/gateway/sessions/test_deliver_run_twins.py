"""A run's compiled delivery (speedups/mqgw_speedups/deliver_run.pyx) against the pure one
(gateway/sessions/deliver_run.py): on real sessions, the same bytes sent, tags, unacked
deliveries (each with its queue, partition, message, consumer and moment), counts, backlog
(and the byte room it leaves), writability and queue state.

Hypothesis varies what the compiled twin books itself (acked or no-ack deliveries, redelivered
flags, small bodies framed in one write and large ones in several, a backlog the run pushes
past the high water mark, a writer already woken, tags already taken) and what it must hand
to the pure twin (a session with rate limits, a message that is not a StoredMessage), and
a channel the client closed, whose frames are dropped.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.amqp.errors import NotFound
from gateway.queues.rate_limit import Limits, TokenBucket
from gateway.queues.runtime import QueueRuntime
from gateway.sessions import deliver_run
from gateway.sessions.session import HIGH_WATER_BYTES, Session
from meta.models import QueueDef
from storage import StoredMessage, twins
from tests.gateway.queues.test_delivery_runs import observed, subscribed
from tests.harness.clock import T0_MS
from tests.harness.twins import built_twin


def compiled() -> Any:
    return built_twin(deliver_run)


def test_sessions_deliver_runs_with_the_compiled_twin_unless_pure_is_forced() -> None:
    chosen = deliver_run if twins.pure_forced() else compiled()
    assert Session.deliver_run is chosen.deliver_run
    assert Session.byte_room is chosen.byte_room


class OwnMessage(StoredMessage):
    """A message of another class than StoredMessage: not one the compiled twin reads."""

    __slots__ = ()


class Taken(NamedTuple):
    size: int
    redelivered: bool
    stored: bool  # a StoredMessage, else an OwnMessage


class Case(NamedTuple):
    run: list[Taken]
    no_ack: bool
    backlog: int
    sending: int  # bytes the writer has taken and is sending
    first_tag: int
    dirty: bool  # the writer already woken
    session_state: str  # "", "limits", "channel closed"


def _delivered(twin: Any, case: Case) -> tuple[Any, ...]:
    queue = QueueRuntime(QueueDef(vhost="/", name="q", queue_id=7), None)  # type: ignore[arg-type]
    session, channel, consumer = subscribed(queue, case.no_ack, 0, 0, case.backlog)
    session.node.scheduler.clock.advance(12.5)  # type: ignore[attr-defined]
    session.sending_bytes = case.sending
    channel.next_delivery_tag = case.first_tag
    if case.dirty:
        session.mark_dirty()
    if case.session_state == "limits":
        session.limits = Limits((TokenBucket(1000.0, 1000.0),), (), lambda: 0.0)
    elif case.session_state == "channel closed":
        session.conn.close_channel(1, NotFound("gone"))  # its channel.close is sent
    run = []
    for offset, taken in enumerate(case.run):
        fields = (offset, 100 + offset, b"", b"q", memoryview(b"\0\0"),
                  memoryview(bytes([offset % 251]) * taken.size), 1, 2, 0)  # fmt: skip
        message = StoredMessage(*fields) if taken.stored else OwnMessage(*fields)
        queue.inflight[0].add(offset)  # as the take booked it
        run.append((0, message, taken.redelivered))
    room_before = twin.byte_room(session)
    twin.deliver_run(session, consumer, queue, run)
    deliveries = [
        (tag, d.queue is queue, d.partition, d.message, d.consumer is consumer, d.at)
        for tag, d in channel.unacked.items()
    ]
    tokens = session.limits.msg_buckets[0].tokens if session.limits is not None else None
    rooms = (room_before, twin.byte_room(session))
    return observed(session, channel, queue), deliveries, consumer.unacked, tokens, rooms


taken = st.builds(
    Taken,
    size=st.one_of(st.integers(0, 300), st.integers(0, 300), st.integers(130_000, 1_500_000)),
    redelivered=st.sampled_from([False, False, True]),
    stored=st.sampled_from([True] * 15 + [False]),
)
cases = st.builds(
    Case,
    run=st.lists(taken, max_size=12),
    no_ack=st.booleans(),
    backlog=st.sampled_from([0, HIGH_WATER_BYTES // 2, HIGH_WATER_BYTES - 100, HIGH_WATER_BYTES]),
    sending=st.sampled_from([0, 0, 1000, HIGH_WATER_BYTES // 2]),
    first_tag=st.sampled_from([1, 1, 7]),
    dirty=st.booleans(),
    session_state=st.sampled_from([""] * 8 + ["limits", "channel closed"]),
)


@settings(max_examples=400, deadline=None)
@given(cases)
def test_the_compiled_run_delivers_what_the_pure_one_does(case: Case) -> None:
    assert _delivered(compiled(), case) == _delivered(deliver_run, case)


def test_a_run_is_booked_and_framed_in_one_send() -> None:
    """Three acked deliveries, one redelivered, one too large for a frame: tags 5 to 7 booked
    unacked at the session's moment, counted, and the writer woken."""
    case = Case(
        [Taken(10, False, True), Taken(200_000, True, True), Taken(0, False, True)],
        no_ack=False, backlog=0, sending=0, first_tag=5, dirty=False, session_state="",
    )  # fmt: skip
    seen, deliveries, unacked, _, rooms = _delivered(compiled(), case)
    assert (seen, deliveries, unacked) == _delivered(deliver_run, case)[:3]
    at = (T0_MS + 12_500) / 1000  # the session's clock when the run went
    booked = [
        (tag, mine, partition, ours, when) for tag, mine, partition, _, ours, when in deliveries
    ]
    assert booked == [(5, True, 0, True, at), (6, True, 0, True, at), (7, True, 0, True, at)]
    assert unacked == 3 and seen[2] == 8  # the consumer's count, the channel's next tag
    assert seen[7] == (3, 0, 1)  # delivered, no-ack, redelivered
    assert seen[6] is True  # the writer is woken
    assert seen[4] == 10 + 200_000 + 3 * deliver_run.DELIVERY_OVERHEAD_BYTES
    assert rooms == (HIGH_WATER_BYTES, HIGH_WATER_BYTES - seen[4])
