"""The model both reclaim property tests check the store against: three queues, one of them
also read by a broadcast group, and what each reader can still read."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from storage import QUEUE_GROUP, LogStore, StoreConfig
from tests.storage.helpers import rec

FILL = b"." * 200  # ~ 17 records a 4 KiB segment
QUEUES = {0: 10, 1: 11, 2: 12}
# (queue, group) pairs that commit: queue 12 is read by its own group and a broadcast one.
READERS = [(10, QUEUE_GROUP), (11, QUEUE_GROUP), (12, QUEUE_GROUP), (12, "broadcast:x")]


def small_config(root: Path, **overrides: object) -> StoreConfig:
    """4 KiB segments and 16-entry index files: reclaim and collection happen every few
    appends."""
    config = StoreConfig(
        root / "store", segment_size_bytes=4096, cq_entries_per_segment=16,
        max_record_bytes=1024,
    )  # fmt: skip
    return dataclasses.replace(config, **overrides)  # type: ignore[arg-type]


def make_durable(store: LogStore) -> None:
    """What housekeeping does before reclaim may delete: fsync, checkpoint, offsets."""
    store.flush()
    store.checkpoint()
    store.persist_offsets()


class ReadingModel:
    def __init__(self, store: LogStore) -> None:
        for queue_id in QUEUES.values():
            store.create_queue(queue_id, 1)
        # A broadcast position is registered when it is made (the store only knows groups that
        # have committed; the gateway commits a new position at once).
        store.commit_offset("broadcast:x", 12, 0, 0)
        self.expected: dict[int, list[bytes]] = {q: [] for q in QUEUES.values()}
        self.sent = 0

    def append(self, store: LogStore, count: int, to: frozenset[int] | set[int]) -> None:
        for _ in range(count):
            body = b"%06d" % self.sent + FILL
            self.sent += 1
            store.append([rec(body, *[(QUEUES[q], 0) for q in sorted(to)])])
            for q in to:
                self.expected[QUEUES[q]].append(body[:6])

    @staticmethod
    def commit(store: LogStore, reader: int, by: int) -> None:
        queue_id, group = READERS[reader]
        _, high = store.partition_range(queue_id, 0)
        current = store.offsets.offsets.get((group, queue_id, 0), 0)
        store.commit_offset(group, queue_id, 0, min(high, current + by))

    def check(self, store: LogStore) -> None:
        """From every group's committed offset on, every message is readable, once, in
        order, and nothing was counted as lost."""
        for q, group in READERS:
            committed = store.offsets.offsets.get((group, q, 0), 0)
            got = store.read(q, 0, committed, max_count=10_000).messages
            assert [bytes(m.body[:6]) for m in got] == self.expected[q][committed:]
            assert [m.queue_offset for m in got] == list(range(committed, len(self.expected[q])))
            assert store.queue_stats(q).dropped_by_retention == 0
