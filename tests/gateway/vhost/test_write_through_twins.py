"""Write-through's compiled twin (speedups/mqgw_speedups/write_through.pyx) against the pure one
(gateway/vhost/write_through.py): on random batches, valid and broken, the same queues are
asked the same things in the same order, take the same messages, and the same queues come
back as absorbed, or the same exception type is raised. The vhost's own suites
(test_queue_absorb.py, the priority queue's) run on whichever twin is in use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.queues.runtime import QueueRuntime
from gateway.vhost import host, write_through
from meta.models import QueueDef
from storage import AppendResult, Record, StoredMessage, twins
from tests.harness.twins import built_twin

PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DESTINATIONS = [(1, 0), (1, 1), (2, 0), (3, 0), (4, 2)]


def compiled() -> Any:
    return built_twin(write_through)


def test_the_vhost_uses_the_compiled_twin_unless_pure_is_forced() -> None:
    chosen = write_through if twins.pure_forced() else compiled()
    assert host.absorb is chosen.absorb
    assert compiled().__file__.endswith(".so")


class FakeQueue:
    """Answers caught_up and absorb as drawn, and logs every call into the shared ``log``."""

    def __init__(self, queue_id: int, caught_up: bool, takes: bool, log: list[Any]) -> None:
        self.queue_id, self._caught_up, self._takes, self.log = queue_id, caught_up, takes, log

    def caught_up(self, starts: Mapping[tuple[int, int], int]) -> bool:
        self.log.append(("caught_up", self.queue_id, sorted(starts.items())))
        return self._caught_up

    def absorb(self, messages: list[tuple[int, StoredMessage]]) -> bool:
        seen = [(p, tuple(bytes(f) if isinstance(f, memoryview) else f for f in m), type(m))
                for p, m in messages]  # fmt: skip
        self.log.append(("absorb", self.queue_id, seen))
        return self._takes


@st.composite
def records(draw: st.DrawFn) -> Any:
    destinations = tuple(draw(st.lists(st.sampled_from(DESTINATIONS), max_size=4)))
    fields = (
        draw(st.binary(max_size=3)),
        draw(st.binary(max_size=3)),
        draw(st.binary(max_size=4)),
        draw(st.binary(max_size=8) | st.binary(max_size=8).map(bytearray)),
        destinations,
        draw(st.integers(0, 1 << 40)),
        draw(st.integers(0, 7)),
    )
    broken = draw(st.integers(0, 30))
    if broken == 0:
        return fields[:6]  # a record of six fields
    if broken == 1:
        return (*fields[:4], list(destinations), *fields[5:])  # destinations not a tuple
    if broken == 2:
        return (*fields[:4], (*destinations, (9,)), *fields[5:])  # a destination of one field
    return Record(*fields)


@PROPERTY
@given(
    batch=st.lists(records(), max_size=8),
    starts=st.dictionaries(st.sampled_from(DESTINATIONS), st.integers(0, 1000)),
    queues=st.dictionaries(st.sampled_from([1, 2, 3, 4]), st.tuples(st.booleans(), st.booleans())),
    as_tuple=st.booleans(),
    offsets_off=st.integers(-1, 1),
)
def test_absorb_twins_agree(
    batch: list[Any],
    starts: dict[tuple[int, int], int],
    queues: dict[int, tuple[bool, bool]],
    as_tuple: bool,
    offsets_off: int,
) -> None:
    offsets = tuple(range(100, 100 + max(0, len(batch) + offsets_off)))
    result = AppendResult(0, 0, len(batch), offsets, starts, store_ts_ms=42)
    seen = {}
    for name, module in (("pure", write_through), ("compiled", compiled())):
        log: list[Any] = []
        by_id = {qid: FakeQueue(qid, up, takes, log) for qid, (up, takes) in queues.items()}
        records_in = tuple(batch) if as_tuple else list(batch)
        try:
            outcome: Any = sorted(q.queue_id for q in module.absorb(by_id, records_in, result))
        except Exception as error:  # the same exception type is what the twins must agree on
            outcome = type(error)
        seen[name] = (outcome, log)
    assert seen["compiled"] == seen["pure"]


def test_a_caught_up_queue_takes_its_messages_in_order_with_their_offsets() -> None:
    log: list[Any] = []
    by_id = {1: FakeQueue(1, True, True, log), 2: FakeQueue(2, False, True, log)}
    batch = [
        Record(b"x", b"k", b"p", b"m0", ((1, 0), (2, 0)), 5, 1),
        Record(b"x", b"k", b"p", b"m1", ((1, 1),), 6, 0),
        Record(b"x", b"k", b"p", b"m2", ((1, 0),), 7, 0),
    ]
    result = AppendResult(0, 0, 3, (10, 20, 30), {(1, 0): 4, (1, 1): 8, (2, 0): 0}, 99)
    for module in (write_through, compiled()):
        log.clear()
        assert [q.queue_id for q in module.absorb(by_id, batch, result)] == [1]
        assert log[1] == ("caught_up", 2, [((1, 0), 4), ((1, 1), 8), ((2, 0), 0)])
        kind, queue_id, messages = log[2]
        assert (kind, queue_id) == ("absorb", 1)
        assert [(p, m[0], m[1], m[5]) for p, m, _ in messages] == [
            (0, 4, 10, b"m0"),
            (1, 8, 20, b"m1"),
            (0, 5, 30, b"m2"),
        ]
        assert all(t is StoredMessage for _, _, t in messages)


class Eager(QueueRuntime):
    """A runtime of its own kind: asked through its methods, never answered for."""

    def caught_up(self, starts: Mapping[tuple[int, int], int]) -> bool:
        return not self.deleted


CAUGHT_UP = {
    "kind": QueueRuntime, "partitions": 1, "cursor": 0, "exhausted": True, "consumers": 1,
    "deleted": False, "paused": False, "broadcast": False, "leases": None, "buffered": 0,
}  # fmt: skip
# A queue that is caught up but for one thing (or nothing): each check is met alone.
QUEUE_STATE = st.builds(
    lambda base, change: {**base, **change},
    st.builds(dict, cursor=st.integers(0, 3), buffered=st.sampled_from([0, 1, 63])).map(
        lambda drawn: {**CAUGHT_UP, **drawn}
    ),
    st.sampled_from([
        {}, {}, {}, {"kind": Eager}, {"partitions": 2}, {"exhausted": False}, {"consumers": 0},
        {"deleted": True}, {"paused": True}, {"broadcast": True}, {"leases": [True]},
        {"leases": [False]}, {"buffered": 64}, {"buffered": 250},
    ]),
)  # fmt: skip


def _runtime(queue_id: int, state: dict[str, Any]) -> QueueRuntime:
    queue: QueueRuntime = state["kind"](
        QueueDef(vhost="/", name=f"q{queue_id}", queue_id=queue_id, partitions=state["partitions"]),
        None,
    )
    for p in range(queue.partitions):
        queue.cursors[p] = state["cursor"]
    held = StoredMessage(0, 0, b"", b"", memoryview(b""), memoryview(b"old"), 0, 0, 0)
    queue.buffer.extend((0, held) for _ in range(state["buffered"]))
    queue.consumers.extend(object() for _ in range(state["consumers"]))  # type: ignore[misc]
    queue.exhausted, queue.deleted = state["exhausted"], state["deleted"]
    queue.paused, queue.broadcast = state["paused"], state["broadcast"]
    if state["leases"] is not None:
        queue.leases = state["leases"] * queue.partitions
    return queue


def _held(queue: QueueRuntime) -> tuple[Any, ...]:
    buffered = [(p, m.queue_offset, m.commit_offset, bytes(m.body)) for p, m in queue.buffer]
    return buffered, list(queue.cursors), queue.fed


@PROPERTY
@given(
    batch=st.lists(records(), max_size=8),
    states=st.dictionaries(st.sampled_from([1, 2, 3, 4]), QUEUE_STATE, min_size=1),
    shifts=st.dictionaries(st.sampled_from(DESTINATIONS), st.sampled_from([0, 0, 0, 1, -1])),
)
def test_absorb_twins_agree_on_real_runtimes(
    batch: list[Any], states: dict[int, dict[str, Any]], shifts: dict[tuple[int, int], int]
) -> None:
    """The compiled twin answers caught_up and absorb itself for a plain runtime of one
    partition on the embedded node: the same queues take the same messages as through the
    runtime's own methods, and leave the same buffer, cursors and feed mark."""
    starts = {d: states[d[0]]["cursor"] + shift for d, shift in shifts.items() if d[0] in states}
    result = AppendResult(0, 0, len(batch), tuple(range(100, 100 + len(batch))), starts, 42)
    seen = {}
    for name, module in (("pure", write_through), ("compiled", compiled())):
        by_id = {qid: _runtime(qid, state) for qid, state in states.items()}
        try:
            outcome: Any = sorted(q.queue_id for q in module.absorb(by_id, batch, result))
        except Exception as error:  # the same exception type is what the twins must agree on
            outcome = type(error)
        seen[name] = (outcome, {qid: _held(q) for qid, q in by_id.items()})
    assert seen["compiled"] == seen["pure"]


def test_a_batch_too_large_for_a_caught_up_queues_buffer_is_left_to_its_read() -> None:
    batch = [Record(b"", b"q", b"", b"m%d" % i, ((1, 0),), 0, 0) for i in range(200)]
    result = AppendResult(0, 0, 200, tuple(range(200)), {(1, 0): 0}, 42)
    for module in (write_through, compiled()):
        queue = _runtime(1, {**CAUGHT_UP, "buffered": 63})
        assert module.absorb({1: queue}, batch, result) == set()  # 63 + 200 > FETCH_BATCH
        assert _held(queue)[1:] == ([0], False) and len(queue.buffer) == 63
