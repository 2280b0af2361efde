"""The log store's queues: each partition's consume queue opened, created, deleted, closed.

A mixin of LogStore: creating and growing queues (all or nothing), deleting them with their
index files and offsets, and marking partitions closed (a record flagged CLOSES reached them).
The registry on disk follows through ``registry.dirty``, saved before the next append.
"""

from __future__ import annotations

from pathlib import Path

from storage.errors import UnknownQueue
from storage.log.consume_queue import ConsumeQueue
from storage.log.state_files import QueueInfo
from storage.log.store_state import StoreState


class QueueCatalog(StoreState):
    """Queues and their partitions' consume queues, for LogStore."""

    def _queue_dir(self, queue_id: int, partition: int) -> Path:
        return self.config.data_dir / "consumequeue" / str(queue_id) / str(partition)

    def _open_partition(self, queue_id: int, partition: int) -> ConsumeQueue:
        cq = ConsumeQueue(
            self.fs,
            self._queue_dir(queue_id, partition),
            queue_id,
            partition,
            self.config.cq_entries_per_segment,
        )
        cq.load()
        return cq

    def _open_queue(self, info: QueueInfo) -> None:
        for partition in range(info.partitions):
            self.cqs[(info.queue_id, partition)] = self._open_partition(info.queue_id, partition)
        self.closed.update((info.queue_id, p) for p in info.closed if p < info.partitions)

    def _new_partition(self, queue_id: int, partition: int) -> ConsumeQueue:
        """A partition being created, its first index file prepared."""
        cq = self._open_partition(queue_id, partition)
        try:
            # Its first index file now, not at its first message: with thousands of queues
            # the first round of publishes would otherwise pay a file creation each.
            cq.prepare()
        except BaseException:
            cq.close()
            raise
        return cq

    def create_queue(self, queue_id: int, partitions: int) -> None:
        """Ensures the queue exists with at least ``partitions`` partitions: creates it, or
        adds empty partitions after the existing ones to reach the count (their offsets start
        at 0); a queue with as many or more is left as it is. Partitions are never removed
        here. All or nothing: a failure (OSError) leaves the queue as it was."""
        self._check_open()
        if not 1 <= partitions <= 65535:
            raise ValueError("partitions must be in 1..65535")
        existing = self.registry.queues.get(queue_id)
        first = 0 if existing is None else existing.partitions
        if first >= partitions:
            return
        added: list[ConsumeQueue] = []
        try:
            for partition in range(first, partitions):
                added.append(self._new_partition(queue_id, partition))
        except BaseException:
            for cq in added:
                cq.close()
            raise
        offset = self.commit_log.write_offset
        if existing is None:
            self.registry.queues[queue_id] = QueueInfo(queue_id, partitions, offset)
        else:
            existing.grow(partitions, offset)
        for cq in added:
            self.cqs[(queue_id, cq.partition)] = cq
        # Saved before the next append (see append): declaring 10,000 queues costs one write,
        # and no record can reach a partition the registry on disk does not know.
        self.registry.dirty = True

    def delete_queue(self, queue_id: int) -> None:
        self._check_open()
        info = self.registry.queues.pop(queue_id, None)
        if info is None:
            raise UnknownQueue(queue_id)
        self.registry.dirty = True  # a queue resurrected by a crash is dropped as unknown
        for partition in range(info.partitions):
            self.cqs.pop((queue_id, partition)).delete()
            self.closed.discard((queue_id, partition))  # in place: the broker holds the set
        self.offsets.drop_queue(queue_id)

    def queues(self) -> dict[int, int]:
        return {q: info.partitions for q, info in self.registry.queues.items()}

    def mark_closed(self, key: tuple[int, int]) -> None:
        """A record flagged CLOSES reached ``key`` (an append, or recovery and a replica
        re-dispatching it: idempotent). Saved with the registry before the next append or by
        the next checkpoint; until then a recovery closes it again from the record."""
        if key in self.closed or key not in self.cqs:
            return
        self.closed.add(key)
        info = self.registry.queues[key[0]]
        info.closed = sorted({*info.closed, key[1]})
        self.registry.dirty = True
