"""The log store's reclaim and retention: which commitlog segments may go, and deleting them.

A mixin of LogStore, built on consumer positions: where each partition is still read from,
the lowest record that pins, the boundary below which everything is consumed, durable and
checkpointed; sealing a drained active segment early; deleting old segments and then the
index entries that pointed into them (counting unread messages lost to ``retention_ms``).
"""

from __future__ import annotations

import logging

from storage.log.positions import ConsumerPositions
from storage.results import QUEUE_GROUP, RetentionReport

log = logging.getLogger("mqgw.storage")


class Retention(ConsumerPositions):
    """Reclaim boundaries and retention of LogStore."""

    def read_starts(self) -> dict[tuple[int, int], int]:
        """Per (queue, partition) that still has something to read: the lowest logical offset
        some group has not consumed (every group's committed offset counts: the queue's own,
        broadcast positions, the timer's levels; unacked deliveries lie past the committed
        offset, which is the lowest unacknowledged one)."""
        committed = self.offsets.reclaim_view()  # a crash must not need what we delete
        lowest: dict[tuple[int, int], int] = {}
        for (_group, queue_id, partition), offset in committed.items():
            key = (queue_id, partition)
            if key in self.cqs and offset < lowest.get(key, offset + 1):
                lowest[key] = offset
        starts: dict[tuple[int, int], int] = {}
        for key in self.cqs:
            low, high = self.partition_range(*key)
            # A partition its queue has not committed on is read from its start.
            own = committed.get((QUEUE_GROUP, *key), 0)
            start = max(low, min(lowest.get(key, own), own))
            if start < high:
                starts[key] = start
        return starts

    def pinned_offsets(self) -> dict[tuple[int, int], int]:
        """Per (queue, partition) with something to read: the lowest commitlog offset of a
        record it can still read (re-pointed entries may point further ahead than later
        ones; ConsumeQueue.lowest_commit accounts for them)."""
        pins: dict[tuple[int, int], int] = {}
        for key, start in self.read_starts().items():
            lowest = self.cqs[key].lowest_commit(start)
            if lowest is not None:
                pins[key] = lowest
        return pins

    def reclaim_boundary(self) -> int:
        """Every record below this offset has been consumed by everything that reads it, and
        is durable and checkpointed (so recovery never needs it)."""
        pins = self.pinned_offsets()
        bound = min(self.durable_offset, self.checkpointed_offset)
        if self.gc_hold is not None:
            bound = min(bound, self.gc_hold)
        return min(bound, *pins.values()) if pins else bound

    def seal_consumed_active(self) -> bool:
        """Seal the active segment early when it holds at least ``roll_consumed_bytes`` and
        nothing in it is still needed (or, with the collector on, what is needed can be
        copied out once it is sealed): a drained queue then frees the disk instead of
        leaving up to a segment (1 GiB) behind. True when sealed; the caller makes the
        filler durable and checkpoints before reclaim can delete the segment."""
        self._check_open()
        active = self.commit_log.files.last
        threshold = self.config.roll_consumed_bytes
        if active is None or threshold <= 0 or active.written < threshold:
            return False
        if self.pending_index is not None or self.gc_hold is not None:
            return False
        if active.start in self.commit_log.sealed_ts_ms:
            return False
        boundary = min(self.pinned_offsets().values(), default=self.commit_log.write_offset)
        drained = boundary >= self.commit_log.write_offset
        collectable = self.config.gc_max_live_ratio > 0 and boundary >= active.start
        if not (drained or collectable):
            return False
        try:
            self.commit_log.seal_active()
        except OSError as exc:  # a full disk: the filler is 28 bytes, try again later
            log.warning("could not seal the active commitlog segment: %s", exc)
            return False
        return True

    def apply_retention(self, now_ms: int | None = None) -> RetentionReport:
        """Delete the commitlog segments nothing can still read (older than
        ``min_retention_ms``), and, only where ``retention_ms`` is set, those past that age
        whether read or not (counted and logged per queue)."""
        self._check_open()
        now = self.clock() if now_ms is None else now_ms
        log_ = self.commit_log
        boundary = self.reclaim_boundary()
        deleted = freed = 0
        unread_deleted = False
        while len(log_.files.segments) > 1:
            first = log_.files.segments[0]
            age_ms = now - log_.sealed_ts_ms.get(first.start, 0)
            consumed = first.start + first.written <= boundary
            expired = self.config.retention_ms is not None and age_ms > self.config.retention_ms
            if not expired and not (consumed and age_ms >= self.config.min_retention_ms):
                break
            unread_deleted = unread_deleted or not consumed
            log_.remove_first_segment()
            freed += first.written
            deleted += 1
        dropped: dict[int, int] = {}
        if deleted and unread_deleted:
            dropped = self._forget_deleted(log_.min_offset)
        elif deleted:
            self._forget_consumed()
            log.info(
                "reclaimed %d commitlog segment(s), %d bytes; unread messages lost: %s",
                deleted,
                freed,
                dropped or "none",
            )
        return RetentionReport(deleted, freed, dropped)

    def _forget_consumed(self) -> None:
        """After deleting only consumed records: drop the index files wholly below each
        queue's read start (cheap: no entry is read; what lies below is never read)."""
        starts = self.read_starts()
        for key, cq in self.cqs.items():
            cq.drop_consumed_before(starts.get(key, cq.max_offset))

    def _forget_deleted(self, commit_min: int) -> dict[int, int]:
        dropped: dict[int, int] = {}
        for (queue_id, partition), cq in self.cqs.items():
            before = self.committed_offset(QUEUE_GROUP, queue_id, partition)
            cq.drop_before_commit_offset(commit_min)
            lost = max(0, min(cq.min_offset, cq.max_offset) - before)
            if lost:
                info = self.registry.queues[queue_id]
                info.dropped[partition] += lost
                dropped[queue_id] = dropped.get(queue_id, 0) + lost
        if dropped:
            self.registry.save()
        return dropped
