"""Values the store returns. Plain tuples and enums: they cross the process seam unchanged."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import NamedTuple

from storage.record import StoredMessage

QUEUE_GROUP = "$queue"  # the consumer group that belongs to a queue itself


class AppendResult(NamedTuple):
    start_offset: int  # commitlog offset of the first record
    end_offset: int  # commitlog offset after the last record
    record_count: int
    # What the append assigned, so a reader that is caught up can take the new messages from
    # the batch in hand instead of reading them back: each record's commitlog offset, the
    # first consume-queue offset written per destination, and the batch's store time.
    record_offsets: tuple[int, ...] = ()
    queue_starts: Mapping[tuple[int, int], int] | None = None
    store_ts_ms: int = 0
    # Destinations the broker refused (cluster mode): in a partition a CLOSES record closed
    # (a keyed-order queue's rescale: the gateway routes them again), or for a length limit
    # carried by the append (x-overflow reject-publish): (record index, queue id,
    # partition). When not empty,
    # record_offsets and queue_starts are left out (the records kept moved up).
    refused: tuple[tuple[int, int, int], ...] = ()


class ReadStatus(StrEnum):
    FOUND = "found"  # messages from the requested offset
    MOVED = "moved"  # requested offset was below the minimum; reading began at the minimum
    NO_NEW_MESSAGE = "no_new_message"  # requested offset == max offset
    OFFSET_OVERFLOW = "offset_overflow"  # requested offset > max offset; nothing read


class ReadResult(NamedTuple):
    status: ReadStatus
    messages: list[StoredMessage]
    next_offset: int  # where the next read should start
    min_offset: int
    max_offset: int
    # A fenced read: when the reader's fence replaced another holder's at this copy, that
    # fence and the partition's end then (below it, the replaced holder may have read here;
    # 0, 0: it replaced none, or this copy never saw another). Gateways that follow two
    # masters for a moment read from copies that learned their fence at different times.
    replaced_fence: int = 0
    replaced_end: int = 0


class DeliveryProgress(NamedTuple):
    """Where the gateway delivering a partition stands, reported with its offset commits (kept
    in memory by the store, never written): the next offset it has not handed out, how many
    messages before it are ready again (requeued, or fetched and not yet delivered), and how
    many of its consumers could take a message. Other gateways count ready messages and hold
    their publishers from it (a cluster's gateways see each other only through the store)."""

    next_offset: int
    ready_behind: int = 0
    takers: int = 0


class PartitionStats(NamedTuple):
    partition: int
    min_offset: int  # first readable offset (after retention and purge)
    max_offset: int
    committed: int  # the group's committed offset
    dropped_by_retention: int
    # The group's last DeliveryProgress (next_offset -1: none reported since the store
    # opened, the partition was purged or a new delivery lease holder took it over), and the
    # ready messages it meant when it arrived (against the end offset then).
    next_offset: int = -1
    ready_behind: int = 0
    takers: int = 0
    reported_ready: int = 0
    # The highest fencing token seen for the group's offsets (0: none): the delivery lease
    # holder that took the partition over last (a new holder reads it before its own).
    fence: int = 0

    @property
    def ready(self) -> int:
        """Messages ready for delivery: after what the delivering gateway handed out, plus
        those back in its hands; without a report, everything after the committed offset
        (what is delivered but unacknowledged included)."""
        if self.next_offset < 0:
            return max(0, self.max_offset - self.committed)
        start = max(self.next_offset, self.min_offset)
        return max(0, self.max_offset - start) + self.ready_behind


class QueueStats(NamedTuple):
    queue_id: int
    partitions: list[PartitionStats]
    ready: int  # PartitionStats.ready, summed over partitions
    dropped_by_retention: int

    @classmethod
    def of(cls, queue_id: int, partitions: list[PartitionStats]) -> QueueStats:
        ready = sum(p.ready for p in partitions)
        return cls(queue_id, partitions, ready, sum(p.dropped_by_retention for p in partitions))


class RetentionReport(NamedTuple):
    deleted_segments: int
    freed_bytes: int
    dropped_unread: dict[int, int]  # queue id -> messages lost unread in this pass


class RecoveryReport(NamedTuple):
    scanned_from: int
    end_offset: int
    truncated_bytes: int  # torn tail cut off
    redispatched: int  # consume-queue entries rebuilt from the commitlog
    cq_entries_dropped: int  # entries that pointed past the commitlog's end
