"""Model-based test: any sequence of append / read / commit / purge / restart, across segment
rollovers, reads back exactly what a plain in-memory model predicts."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from storage import QUEUE_GROUP, LogStore, ReadStatus, Record, StoreConfig

QUEUES = {1: 2, 2: 1, 3: 3}  # queue id -> partitions
DESTS = [(q, p) for q, n in QUEUES.items() for p in range(n)]

message = st.tuples(
    st.binary(max_size=300),
    st.lists(st.sampled_from(DESTS), min_size=1, max_size=4, unique=True),
)


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp())
        self.config = StoreConfig(
            self.dir, segment_size_bytes=2048, cq_entries_per_segment=8, max_record_bytes=512
        )
        self.store = LogStore.open(self.config)
        for q, n in QUEUES.items():
            self.store.create_queue(q, n)
        self.messages: dict[tuple[int, int], list[bytes]] = {d: [] for d in DESTS}
        self.floor: dict[tuple[int, int], int] = dict.fromkeys(DESTS, 0)
        self.committed: dict[tuple[int, int], int] = dict.fromkeys(DESTS, 0)

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir)

    @rule(batch=st.lists(message, min_size=1, max_size=20))
    def append(self, batch: list[tuple[bytes, list[tuple[int, int]]]]) -> None:
        records = [Record(b"e", b"k", b"p", body, tuple(dests)) for body, dests in batch]
        self.store.append(records)
        for body, dests in batch:
            for d in dests:
                self.messages[d].append(body)

    @rule(dest=st.sampled_from(DESTS), offset=st.integers(0, 120), count=st.integers(1, 50))
    def read(self, dest: tuple[int, int], offset: int, count: int) -> None:
        result = self.store.read(*dest, offset, max_count=count)
        low, high = self.floor[dest], len(self.messages[dest])
        assert (result.min_offset, result.max_offset) == (low, high)
        start = max(offset, low)
        if offset > high:
            assert result.status is ReadStatus.OFFSET_OVERFLOW
            assert result.messages == []
            return
        assert result.status is (
            ReadStatus.MOVED
            if offset < low
            else ReadStatus.FOUND
            if start < high
            else ReadStatus.NO_NEW_MESSAGE
        )
        expected = self.messages[dest][start : start + count]
        assert [bytes(m.body) for m in result.messages] == expected
        assert [m.queue_offset for m in result.messages] == list(
            range(start, start + len(expected))
        )
        assert result.next_offset == start + len(expected)

    @rule(dest=st.sampled_from(DESTS), data=st.data())
    def commit(self, dest: tuple[int, int], data: st.DataObject) -> None:
        offset = data.draw(st.integers(0, len(self.messages[dest])))
        self.store.commit_offset(QUEUE_GROUP, *dest, offset)
        self.committed[dest] = offset

    @rule(queue=st.sampled_from(sorted(QUEUES)))
    def purge(self, queue: int) -> None:
        expected = 0
        for p in range(QUEUES[queue]):
            d = (queue, p)
            expected += len(self.messages[d]) - max(self.committed[d], self.floor[d])
            self.floor[d] = len(self.messages[d])
        assert self.store.purge(queue) == expected

    @precondition(lambda self: True)
    @rule(clean=st.booleans())
    def restart(self, clean: bool) -> None:
        if clean:
            self.store.close()
        else:
            self.store.persist_offsets()  # offsets are periodic; the log must need nothing else
            self.store._release()
            (self.dir / "checkpoint.json").unlink(missing_ok=True)
        self.store = LogStore.open(self.config)
        # As the gateway does at start: declare every queue metadata knows (idempotent). A
        # queue created after the last append or checkpoint is only on disk from then on.
        for q, n in QUEUES.items():
            self.store.create_queue(q, n)

    @invariant()
    def ready_counts_match(self) -> None:
        for q, n in QUEUES.items():
            expected = sum(
                len(self.messages[(q, p)]) - max(self.committed[(q, p)], self.floor[(q, p)])
                for p in range(n)
            )
            assert self.store.ready_count(q) == expected


TestStoreModel = StoreModel.TestCase
TestStoreModel.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
