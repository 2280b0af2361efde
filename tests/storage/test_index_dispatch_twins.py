"""A batch's index entries dispatched by the compiled twin (speedups/mqgw_speedups/
index_dispatch.pyx) and by the pure one (storage/log/index_dispatch.py): on real consume queues
in files, the same undo entries, starts, entries, in-memory tails and files.

Hypothesis varies what the compiled twin appends itself (deferred entries that fit the tail)
and what it leaves to ConsumeQueue.append (not deferred, a tail that would grow past the
write-behind size, a consume queue of a subclass), runs of several entries and destinations,
destinations reached by several runs, and a queue deleted since routing (no consume queue).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage import twins
from storage.log import index_dispatch
from storage.log.consume_queue import WRITE_BEHIND_BYTES, ConsumeQueue
from storage.log.file_system import FileSystem
from storage.record import CQ_ENTRY, CQ_ENTRY_SIZE, DispatchRun
from tests.harness.twins import built_twin

QUEUES = [(1, 0), (1, 1), (2, 0), (3, 0)]  # (queue id, partition); (3, 0) of a subclass
GONE = (9, 0)  # a queue deleted since routing: no consume queue


def compiled() -> Any:
    return built_twin(index_dispatch)


def test_the_store_dispatches_with_the_compiled_twin_unless_pure_is_forced() -> None:
    chosen = index_dispatch if twins.pure_forced() else compiled()
    assert index_dispatch.picked is chosen.dispatch


class OwnQueue(ConsumeQueue):
    """A consume queue of a subclass that counts its appends: the twin must call them."""

    def append(self, entries: bytes | bytearray, last: int, defer: bool = False) -> None:
        super().append(entries, last, defer)
        self.__dict__["appends"] = self.__dict__.get("appends", 0) + 1


class Run(NamedTuple):
    destinations: list[int]  # indexes into QUEUES, or len(QUEUES) for GONE
    entries: int


class Case(NamedTuple):
    held: list[int]  # entries each consume queue holds in memory before the batch
    runs: list[Run]
    defer: bool
    first_commit: int  # the batch's first record's commit offset


def _dispatched(twin: Any, case: Case, directory: Path) -> tuple[Any, ...]:
    fs = FileSystem()
    cqs: dict[tuple[int, int], ConsumeQueue] = {}
    for (queue_id, partition), held in zip(QUEUES, case.held, strict=True):
        kind = OwnQueue if queue_id == 3 else ConsumeQueue
        place = directory / f"{queue_id}-{partition}"
        place.mkdir(parents=True)
        cq = kind(fs, place, queue_id, partition, 64)
        if held:
            cq.append(_entries(100 * queue_id, held), 100 * queue_id, defer=True)
        cqs[(queue_id, partition)] = cq
    runs, commit = [], case.first_commit
    for run in case.runs:
        destinations = tuple(
            GONE if d == len(QUEUES) else QUEUES[d] for d in dict.fromkeys(run.destinations)
        )
        runs.append(DispatchRun(destinations, bytearray(_entries(commit, run.entries))))
        commit += run.entries
    undo: list[tuple[ConsumeQueue, int, int]] = []
    starts: dict[tuple[int, int], int] = {}
    twin.dispatch(cqs, runs, undo, starts, case.defer)
    order = list(cqs.values())
    undone = [(order.index(cq), end, last) for cq, end, last in undo]
    return undone, starts, [_state(cq) for cq in order]


def _state(cq: ConsumeQueue) -> tuple[Any, ...]:
    """Its end, last commit offset, in-memory tail, every entry and own appends counted."""
    entries = [cq.entry(n) for n in range(cq.max_offset)]
    return (cq.max_offset, cq.last_commit_offset, bytes(cq.unwritten), entries,
            cq.__dict__.get("appends"))  # fmt: skip


def _entries(first_commit: int, count: int) -> bytes:
    return b"".join(CQ_ENTRY.pack(first_commit + n, 30 + n, 7) for n in range(count))


runs = st.builds(
    Run,
    destinations=st.lists(st.integers(0, len(QUEUES)), min_size=1, max_size=3),
    entries=st.sampled_from([1, 1, 2, 5]),
)
cases = st.builds(
    Case,
    held=st.lists(
        st.sampled_from([0, 0, 3, *(WRITE_BEHIND_BYTES // CQ_ENTRY_SIZE - n for n in (1, 2, 5))]),
        min_size=len(QUEUES),
        max_size=len(QUEUES),
    ),
    runs=st.lists(runs, min_size=1, max_size=8),
    defer=st.sampled_from([True, True, False]),
    first_commit=st.sampled_from([1000, 1000, 2**64 - 100]),  # all 8 bytes of the offset
)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=cases)
def test_the_compiled_dispatch_indexes_as_the_pure_one_does(case: Case, tmp_path: Path) -> None:
    at = tmp_path / str(len(list(tmp_path.iterdir())))
    assert _dispatched(compiled(), case, at / "c") == _dispatched(index_dispatch, case, at / "p")


def test_deferred_entries_wait_in_the_tail_until_it_is_full(tmp_path: Path) -> None:
    """Two deferred runs to one queue wait in memory; a third to a queue whose tail is nearly
    full is written with the tail; a run to a deleted queue indexes nothing."""
    full = WRITE_BEHIND_BYTES // CQ_ENTRY_SIZE - 1
    runs = [Run([0], 1), Run([0, 4], 2), Run([2], 2)]
    case = Case([0, 0, full, 0], runs, defer=True, first_commit=1000)
    undo, starts, states = _dispatched(compiled(), case, tmp_path)
    assert undo == [(0, 0, -1), (0, 1, 1000), (2, full, 200)]
    assert starts == {(1, 0): 0, (2, 0): full}
    assert states[0][:3] == (3, 1002, _entries(1000, 1) + _entries(1001, 2))
    assert states[2][:3] == (full + 2, 1004, b"")  # written: nothing held
    assert states[2][3][full:] == [(1003, 30, 7), (1004, 31, 7)]
