"""A plain queue's compiled turn (speedups/mqgw_speedups/plain_turn.pyx) against the general
one (gateway/queues/plain_turn.py, which is QueueRuntime.pump): on real sessions, the same
bytes sent, results, tags, unacked deliveries, counts and queue state.

Hypothesis varies what the inline take must leave to the general one (requeued messages,
messages with an expiration, transients from before a restart), what it books itself
(redelivered flags, what may have gone out before a restart), the consumer's and the
channel's credit (prefetch, no-ack, flow, a closing channel, an operator's stop), the
session's backlog, the bodies (large ones fill its output mid-run), and queues the compiled
turn must not take (paused, not plain, two consumers, rate limited).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.queues import plain_turn, runtime, scheduler
from gateway.queues.rate_limit import TokenBucket
from gateway.sessions.channel_state import Consumer
from gateway.sessions.session import HIGH_WATER_BYTES
from meta.models import QueueDef
from storage import StoredMessage, twins
from storage.record import EXPIRES, PERSISTENT, REDELIVERED
from tests.gateway.queues.test_delivery_runs import observed, subscribed
from tests.harness.twins import built_twin

FAR_EXPIRATION = b"\x01\x00" + bytes([14]) + b"99999999999999"  # an expiration, never reached


def compiled() -> Any:
    return built_twin(plain_turn)


def test_the_scheduler_uses_the_compiled_turn_unless_pure_is_forced() -> None:
    chosen = plain_turn if twins.pure_forced() else compiled()
    assert scheduler.pump is chosen.pump


class Message(NamedTuple):
    size: int
    flags: int
    requeued: bool


class Case(NamedTuple):
    messages: list[Message]
    restart_below: int  # transients below this offset are gone (a restart)
    maybe_delivered: int  # below this offset: flagged redelivered
    no_ack: bool
    prefetch: int
    prefetch_global: int
    quota: int
    backlog: int
    turns: int
    consumer_state: str  # "", "flow", "closing", "stopped"
    queue_state: str  # "", "paused", "not plain", "two consumers", "rate"


def _queue(case: Case) -> runtime.QueueRuntime:
    queue = runtime.QueueRuntime(QueueDef(vhost="/", name="q", queue_id=7), None)  # type: ignore[arg-type]
    for offset, m in enumerate(case.messages):
        properties = FAR_EXPIRATION if m.flags & EXPIRES else b"\0\0"
        body = memoryview(bytes([offset % 251]) * m.size)
        message = StoredMessage(offset, 1000 + offset, b"", b"q", memoryview(properties), body,
                                1, 2, m.flags)  # fmt: skip
        if m.requeued:
            queue._return(0, message)
        else:
            queue.buffer.append((0, message))
        queue.count_in(m.size, m.flags)
    queue.cursors[0] = len(case.messages)
    queue.restart_below[0] = case.restart_below
    queue.maybe_delivered[0] = case.maybe_delivered
    queue.exhausted = True
    return queue


def _turned(pump: Any, case: Case) -> tuple[Any, ...]:
    queue = _queue(case)
    session, channel, _ = subscribed(
        queue, case.no_ack, case.prefetch, case.prefetch_global, case.backlog
    )
    channel.flow_active = case.consumer_state != "flow"
    channel.closing = case.consumer_state == "closing"
    session.stopped = case.consumer_state == "stopped"
    if case.queue_state == "paused":
        queue.paused = True
    elif case.queue_state == "not plain":
        queue.plain = False
    elif case.queue_state == "two consumers":
        other = Consumer("other", channel, queue, case.no_ack, False, 0, 1)
        channel.consumers["other"] = other
        queue.add_consumer(other)
    elif case.queue_state == "rate":
        queue.rate_limit = TokenBucket(30.0, 0.0)
    results = [pump(queue, case.quota, 0.0) for _ in range(case.turns)]
    return results, observed(session, channel, queue)


messages = st.builds(
    Message,
    size=st.one_of(st.integers(0, 300), st.integers(0, 300), st.integers(200_000, 1_500_000)),
    flags=st.sampled_from([0, 0, 0, PERSISTENT, REDELIVERED, EXPIRES, EXPIRES | PERSISTENT]),
    requeued=st.sampled_from([False] * 6 + [True]),
)
cases = st.builds(
    Case,
    messages=st.lists(messages, max_size=40),
    restart_below=st.sampled_from([0, 0, 3, 12]),
    maybe_delivered=st.sampled_from([0, 5, 5, 40]),
    no_ack=st.booleans(),
    prefetch=st.sampled_from([0, 1, 2, 5, 30]),
    prefetch_global=st.sampled_from([0, 1, 3, 25]),
    quota=st.sampled_from([1, 3, 64]),
    backlog=st.sampled_from([0, HIGH_WATER_BYTES // 2, HIGH_WATER_BYTES - 100, HIGH_WATER_BYTES]),
    turns=st.integers(1, 4),
    consumer_state=st.sampled_from([""] * 6 + ["flow", "closing", "stopped"]),
    queue_state=st.sampled_from([""] * 8 + ["paused", "not plain", "two consumers", "rate"]),
)


@settings(max_examples=400, deadline=None)
@given(cases)
def test_the_compiled_turn_delivers_what_the_general_one_does(case: Case) -> None:
    assert _turned(compiled().pump, case) == _turned(plain_turn.pump, case)


def test_the_inline_take_books_a_run_as_take_does() -> None:
    """Five waiting: one requeued, one with an expiration, two from before a restart (one
    transient, gone) and one taken inline below what may have gone out before the restart:
    the compiled turn takes them in the order and with the flags the general one gives."""
    case = Case(
        [Message(10, PERSISTENT, False), Message(10, 0, False), Message(10, REDELIVERED, True),
         Message(10, EXPIRES, False), Message(10, 0, False)],
        restart_below=2, maybe_delivered=5, no_ack=False, prefetch=0, prefetch_global=0,
        quota=64, backlog=0, turns=1, consumer_state="", queue_state="",
    )  # fmt: skip
    turned = _turned(compiled().pump, case)
    assert turned == _turned(plain_turn.pump, case)
    seen = turned[1]
    # offset 1 (transient, below the restart) is gone; 2 (requeued) goes first
    assert [offset for _, _, offset in seen[1]] == [2, 0, 3, 4]
    assert seen[7] == (4, 0, 4)  # 2 by its flag; 0, 3 and 4 below maybe_delivered
    assert seen[8][1:] == (0, 0, True)
