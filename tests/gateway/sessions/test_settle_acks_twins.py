"""Acks settled by the compiled twin (speedups/mqgw_speedups/settle_acks.pyx) against the pure
one (gateway/sessions/settle_acks.py): on real queues and consumers, the same queue states
(in flight, requeue counts, committed-offset flag, acked), consumer counts, queues returned,
and the same of them found worth a turn.

Hypothesis varies what the compiled twin answers itself (a plain QueueRuntime of one or two
partitions, messages that came back before, deliveries from basic.get with no consumer) and
what it must ask (a runtime of a subclass with its own settle and may_deliver, a message that
is not a StoredMessage), and the queues' buffers, requeues and whether they read the store
to its end.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.queues.held_messages import HeldMessages
from gateway.queues.runtime import QueueRuntime
from gateway.queues.settlement import Settlement
from gateway.sessions import settle_acks
from gateway.sessions.channel_state import Consumer, Delivery
from meta.models import QueueDef
from storage import StoredMessage, twins
from tests.gateway.queues.test_delivery_runs import subscribed
from tests.harness.twins import built_twin


def compiled() -> Any:
    return built_twin(settle_acks)


def test_sessions_settle_acks_with_the_compiled_twin_unless_pure_is_forced() -> None:
    chosen = settle_acks if twins.pure_forced() else compiled()
    assert settle_acks.picked_settle is chosen.settle
    assert settle_acks.picked_worth_a_turn is chosen.worth_a_turn


def test_the_runtime_answers_with_the_methods_the_twin_answers_for() -> None:
    """The compiled twin answers for a QueueRuntime as these two would: a runtime that
    settled or looked otherwise would need the twin changed too."""
    assert QueueRuntime.settle is Settlement.settle
    assert QueueRuntime.may_deliver is HeldMessages.may_deliver


class OwnMessage(StoredMessage):
    """A message of another class than StoredMessage: not one the twin reads itself."""

    __slots__ = ()


class Counting(QueueRuntime):
    """A runtime of a subclass: settles as its own method says, and says it has nothing to
    deliver. The twin must ask it."""

    def settle(self, partition: int, message: StoredMessage) -> None:
        super().settle(partition, message)
        self.__dict__["own_settles"] = self.__dict__.get("own_settles", 0) + 1

    @property
    def may_deliver(self) -> bool:
        return False


class QueueCase(NamedTuple):
    subclass: bool
    partitions: int
    returned: int  # its in-flight messages that came back before (a requeue count)
    buffered: bool
    requeued: bool
    exhausted: bool


class Ack(NamedTuple):
    queue: int  # which of the case's queues
    partition: int
    offset: int
    own_message: bool
    consumer: bool  # False: a basic.get's delivery


class Case(NamedTuple):
    queues: list[QueueCase]
    acks: list[Ack]


def _settled(twin: Any, case: Case) -> tuple[Any, ...]:
    queues = []
    for number, q in enumerate(case.queues):
        runtime = Counting if q.subclass else QueueRuntime
        definition = QueueDef(vhost="/", name=f"q{number}", queue_id=number + 1,
                              partitions=q.partitions)  # fmt: skip
        queue = runtime(definition, None)  # type: ignore[arg-type]
        for partition in range(q.partitions):
            queue.inflight[partition].update(range(8))
            for offset in range(q.returned):
                queue.returns[(partition, offset)] = 1
        if q.buffered:
            queue.buffer.append((0, _message(False, 9)))
        if q.requeued:
            queue._return(0, _message(False, 10))
        queue.exhausted = q.exhausted
        queues.append(queue)
    consumers = []
    for queue in queues:
        _, _, consumer = subscribed(queue, False, 0, 0, 0)
        consumer.unacked = len(case.acks)
        consumers.append(consumer)
    deliveries = []
    for ack in case.acks:
        queue = queues[ack.queue % len(queues)]
        owner: Consumer | None = consumers[queues.index(queue)] if ack.consumer else None
        partition = ack.partition % queue.partitions
        deliveries.append(Delivery(queue, partition, _message(ack.own_message, ack.offset), owner))
    woken = twin.settle(deliveries)
    worth = twin.worth_a_turn(woken)
    states = [
        (sorted(sorted(s) for s in q.inflight), q.returns, q.commit_dirty, q.acked,
         q.__dict__.get("own_settles"))
        for q in queues
    ]  # fmt: skip
    return (
        states,
        [c.unacked for c in consumers],
        sorted(q.name for q in woken),
        sorted(q.name for q in worth),
    )


def _message(own: bool, offset: int) -> StoredMessage:
    fields = (offset, 100 + offset, b"", b"q", memoryview(b""), memoryview(b"x"), 1, 2, 0)
    return OwnMessage(*fields) if own else StoredMessage(*fields)


queue_cases = st.builds(
    QueueCase,
    subclass=st.sampled_from([False, False, False, True]),
    partitions=st.sampled_from([1, 1, 2]),
    returned=st.sampled_from([0, 0, 3]),
    buffered=st.booleans(),
    requeued=st.sampled_from([False, False, True]),
    exhausted=st.booleans(),
)
acks = st.builds(
    Ack,
    queue=st.integers(0, 3),
    partition=st.integers(0, 1),
    offset=st.integers(0, 9),
    own_message=st.sampled_from([False] * 10 + [True]),
    consumer=st.sampled_from([True, True, True, False]),
)
cases = st.builds(
    Case, queues=st.lists(queue_cases, min_size=1, max_size=4), acks=st.lists(acks, max_size=20)
)


@settings(max_examples=400, deadline=None)
@given(cases)
def test_the_compiled_twin_settles_acks_as_the_pure_one_does(case: Case) -> None:
    assert _settled(compiled(), case) == _settled(settle_acks, case)


def test_acks_leave_flight_and_a_queue_with_more_is_worth_a_turn() -> None:
    """Three acks on a plain queue with a message buffered, one of them for a message that
    came back before, one from basic.get: out of flight and of the requeue counts, acked,
    its consumer's count down by two; worth a turn. A queue that read the store to its end
    and holds nothing is not."""
    busy = QueueCase(False, 1, 1, buffered=True, requeued=False, exhausted=True)
    idle = QueueCase(False, 1, 0, buffered=False, requeued=False, exhausted=True)
    case = Case([busy, idle], [Ack(0, 0, 0, False, True), Ack(0, 0, 4, False, True),
                               Ack(0, 0, 5, False, False), Ack(1, 0, 2, False, True)])  # fmt: skip
    states, unacked, woken, worth = _settled(compiled(), case)
    assert states[0] == ([[1, 2, 3, 6, 7]], {}, True, 3, None)
    assert unacked == [2, 3]
    assert (woken, worth) == (["q0", "q1"], ["q0"])
