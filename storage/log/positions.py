"""The log store's consumer positions: committed offsets, fences, and the counts they give.

A mixin of LogStore: committing and reading a group's offset per partition (with its fencing
token and the progress a consumer reports), the queue's stats and ready count from those
offsets, purge (a floor under every partition) and finding an offset by time.
"""

from __future__ import annotations

from storage.errors import UnknownQueue
from storage.log.store_state import StoreState
from storage.results import QUEUE_GROUP, DeliveryProgress, PartitionStats, QueueStats

_NO_REPORT = (-1, 0, 0, 0)  # PartitionStats' progress fields when none was reported
_NONE_REPLACED = (0, 0)


class ConsumerPositions(StoreState):
    """Committed offsets, fences and queue counts of LogStore."""

    def commit_offset(
        self,
        group: str,
        queue_id: int,
        partition: int,
        offset: int,
        fence: int = 0,
        progress: DeliveryProgress | None = None,
    ) -> None:
        """``fence``: the caller's fencing token (0: unfenced); StaleFence below the
        highest seen for the key, and nothing changes. ``progress``: kept in memory for
        queue_stats."""
        self._cq(queue_id, partition)
        key = (group, queue_id, partition)
        if fence:
            self._admit(key, fence)
        if progress is not None:
            _, end = self.partition_range(queue_id, partition)
            self.offsets.progress[key] = (*progress, max(0, end - progress[0]) + progress[1])
        if self.offsets.offsets.get(key) != offset:
            self.offsets.offsets[key] = offset
            self.offsets.changed = True

    def admit_fence(self, group: str, queue_id: int, partition: int, fence: int) -> tuple[int, int]:
        """A call carrying ``fence`` (a read): StaleFence below the highest seen. Returns
        the fence it replaced here and the partition's end then ((0, 0): none)."""
        key = (group, queue_id, partition)
        self._admit(key, fence)
        return self.offsets.replaced.get(key, _NONE_REPLACED)

    def _admit(self, key: tuple[str, int, int], fence: int) -> None:
        end = 0
        if fence > self.offsets.fences.get(key, 0):  # a new holder: what may have been read
            end = self.partition_range(key[1], key[2])[1]
        self.offsets.fence(key, fence, end)

    def committed_offset(self, group: str, queue_id: int, partition: int, fence: int = 0) -> int:
        """The committed offset, never below the partition's minimum. A ``fence`` is
        admitted (and registered) as for commit_offset: a new lease holder's first read."""
        low, _ = self.partition_range(queue_id, partition)
        if fence:
            self._admit((group, queue_id, partition), fence)
        return max(self.offsets.offsets.get((group, queue_id, partition), 0), low)

    def queue_stats(self, queue_id: int, group: str = QUEUE_GROUP) -> QueueStats:
        info = self.registry.queues.get(queue_id)
        if info is None:
            raise UnknownQueue(queue_id)
        parts = []
        reports = self.offsets.progress
        for p in range(info.partitions):
            low, high = self.partition_range(queue_id, p)
            committed = self.committed_offset(group, queue_id, p)
            report = reports.get((group, queue_id, p), _NO_REPORT)
            fence = self.offsets.fences.get((group, queue_id, p), 0)
            parts.append(PartitionStats(p, low, high, committed, info.dropped[p], *report, fence))
        return QueueStats.of(queue_id, parts)

    def ready_count(self, queue_id: int, group: str = QUEUE_GROUP) -> int:
        return self.queue_stats(queue_id, group).ready

    def purge(self, queue_id: int, group: str = QUEUE_GROUP) -> int:
        """Make every stored message of the queue unreadable; returns how many were ready."""
        stats = self.queue_stats(queue_id, group)
        info = self.registry.queues[queue_id]
        info.floors = [s.max_offset for s in stats.partitions]
        self.registry.save()
        self.offsets.forget_progress(queue_id)  # what was ready is gone: reports start anew
        return stats.ready

    def offset_for_time(self, queue_id: int, partition: int, ts_ms: int) -> int:
        low, _ = self.partition_range(queue_id, partition)
        return max(low, self._cq(queue_id, partition).offset_for_time(ts_ms))
