"""Model-based test: any sequence of append / read / commit / purge / growth / restart, across
segment rollovers, reads back exactly what a plain in-memory model predicts."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from storage import QUEUE_GROUP, LogStore, ReadStatus, Record, StoreConfig, UnknownQueue

QUEUES = {1: 2, 2: 1, 3: 3}  # queue id -> partitions at the start
GROWN = {1: 4, 2: 2, 3: 3}  # queue id -> partitions create_queue may grow it to
# Partitions not added yet too: a record routed there is stored and indexed nowhere.
DESTS = [(q, p) for q, n in GROWN.items() for p in range(n)]

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
        self.partitions = dict(QUEUES)
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
                if self.exists(d):
                    self.messages[d].append(body)

    def exists(self, dest: tuple[int, int]) -> bool:
        return dest[1] < self.partitions[dest[0]]

    @rule(dest=st.sampled_from(DESTS), offset=st.integers(0, 120), count=st.integers(1, 50))
    def read(self, dest: tuple[int, int], offset: int, count: int) -> None:
        if not self.exists(dest):
            with pytest.raises(UnknownQueue):
                self.store.read(*dest, offset, max_count=count)
            return
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
        if not self.exists(dest):
            with pytest.raises(UnknownQueue):
                self.store.commit_offset(QUEUE_GROUP, *dest, 0)
            return
        offset = data.draw(st.integers(0, len(self.messages[dest])))
        self.store.commit_offset(QUEUE_GROUP, *dest, offset)
        self.committed[dest] = offset

    @rule(queue=st.sampled_from(sorted(QUEUES)))
    def purge(self, queue: int) -> None:
        expected = 0
        for p in range(self.partitions[queue]):
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
        # queue created (or grown) after the last append or checkpoint is only on disk from
        # then on; its partitions added since are still empty then.
        for q, n in self.partitions.items():
            self.store.create_queue(q, n)

    @rule(queue=st.sampled_from(sorted(GROWN)), data=st.data())
    def grow(self, queue: int, data: st.DataObject) -> None:
        partitions = data.draw(st.integers(1, GROWN[queue]))
        self.store.create_queue(queue, partitions)  # fewer than it has: nothing changes
        self.partitions[queue] = max(self.partitions[queue], partitions)
        assert self.store.queues() == self.partitions

    @invariant()
    def ready_counts_match(self) -> None:
        assert self.store.queues() == self.partitions
        for q, n in self.partitions.items():
            expected = sum(
                len(self.messages[(q, p)]) - max(self.committed[(q, p)], self.floor[(q, p)])
                for p in range(n)
            )
            assert self.store.ready_count(q) == expected


TestStoreModel = StoreModel.TestCase
TestStoreModel.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
