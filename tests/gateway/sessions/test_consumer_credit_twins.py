"""A consumer's compiled grant (speedups/mqgw_speedups/consumer_credit.pyx) against the pure one
(gateway/sessions/consumer_credit.py, which asks has_credit and room): on real sessions, the
same answer, whatever holds the consumer back.

Hypothesis starts from a consumer with credit and changes one or two things: the channel's
flow, a closing channel, an operator's stop (with or without the queue's own control saying
run), the session's backlog, no-ack, the consumer's and the channel's prefetch and what is
unacked against them, the session's rate limits (asked through the methods), and ``most``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.queues.rate_limit import Limits, TokenBucket
from gateway.queues.runtime import QueueRuntime
from gateway.sessions import consumer_credit
from gateway.sessions.channel_state import Consumer, Delivery
from meta.models import QueueDef
from storage import StoredMessage, twins
from tests.gateway.queues.test_delivery_runs import subscribed
from tests.harness.twins import built_twin


def compiled() -> Any:
    return built_twin(consumer_credit)


def test_consumers_grant_with_the_compiled_twin_unless_pure_is_forced() -> None:
    chosen = consumer_credit if twins.pure_forced() else compiled()
    assert Consumer.grant is chosen.grant


class Case(NamedTuple):
    most: int
    no_ack: bool
    prefetch: int
    prefetch_global: int
    unacked: int  # the consumer's deliveries not yet acked (the channel's too)
    others_unacked: int  # the channel's, for its other consumers
    changes: list[str]


CHANGES = ["flow", "closing", "stopped", "stopped, queue runs", "not writable", "limits",
           "limits, empty"]  # fmt: skip


def _granted(grant: Any, case: Case) -> int:
    queue = QueueRuntime(QueueDef(vhost="/", name="q", queue_id=7), None)  # type: ignore[arg-type]
    session, channel, consumer = subscribed(
        queue, case.no_ack, case.prefetch, case.prefetch_global, 0
    )
    message = StoredMessage(0, 0, b"", b"q", memoryview(b""), memoryview(b""), 0, 0, 0)
    for tag in range(1, case.unacked + case.others_unacked + 1):
        owner = consumer if tag <= case.unacked else None
        channel.unacked[tag] = Delivery(queue, 0, message, owner)
    consumer.unacked = case.unacked
    for change in case.changes:
        if change == "flow":
            channel.flow_active = False
        elif change == "closing":
            channel.closing = True
        elif change.startswith("stopped"):
            session.stopped = True
            queue.control_running = change.endswith("runs")
        elif change == "not writable":
            session.writable = False
        elif change.startswith("limits"):
            rate = 0.0 if change.endswith("empty") else 1000.0
            session.limits = Limits((TokenBucket(rate, 0.0),), (), lambda: 0.0)
    return int(grant(consumer, case.most))


cases = st.builds(
    Case,
    most=st.sampled_from([1, 3, 64]),
    no_ack=st.sampled_from([False, False, True]),
    prefetch=st.sampled_from([0, 1, 2, 5, 30]),
    prefetch_global=st.sampled_from([0, 0, 1, 3, 25]),
    unacked=st.integers(0, 6),
    others_unacked=st.sampled_from([0, 0, 2, 30]),
    changes=st.lists(st.sampled_from(CHANGES), max_size=2),
)


@settings(max_examples=500, deadline=None)
@given(cases)
def test_the_compiled_grant_answers_as_has_credit_and_room_do(case: Case) -> None:
    assert _granted(compiled().grant, case) == _granted(consumer_credit.grant, case)


def test_a_grant_is_the_smaller_of_the_two_prefetch_rooms() -> None:
    """Prefetch 5 with 2 unacked leaves 3; the channel's 25 with 20 unacked (its other
    consumers' too) leaves 5; no-ack leaves what was asked; an operator's stop leaves none
    unless the queue's control says run."""
    case = Case(64, False, 5, 25, 2, 18, [])
    assert _granted(compiled().grant, case) == 3
    assert _granted(compiled().grant, case._replace(prefetch=10)) == 5
    assert _granted(compiled().grant, case._replace(no_ack=True)) == 64
    assert _granted(compiled().grant, case._replace(changes=["stopped"])) == 0
    assert _granted(compiled().grant, case._replace(changes=["stopped, queue runs"])) == 3
