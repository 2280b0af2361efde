"""Store settings. The gateway's pydantic settings build one of these; tests pass tiny sizes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from storage.record import BLANK_SIZE

# A record is its message body plus a header, destinations, exchange, routing key and
# properties: the store's largest record is the largest message plus this much.
RECORD_HEADROOM_BYTES = 64 << 10


def max_record_bytes_for(max_message_size_bytes: int) -> int:
    return max_message_size_bytes + RECORD_HEADROOM_BYTES


def largest_record_in(segment_size_bytes: int) -> int:
    """What one commitlog segment holds at most: it keeps room for two blank fillers."""
    return segment_size_bytes - 2 * BLANK_SIZE


class FlushPolicy(StrEnum):
    SYNC = "sync"  # group commit: an append completes after the fsync that covers it
    ASYNC = "async"  # an append completes after write(); fsync runs on an interval


@dataclass(frozen=True)
class StoreConfig:
    data_dir: Path
    segment_size_bytes: int = 1 << 30
    cq_entries_per_segment: int = 300_000
    # Fits the small segments tests and tools use; the gateway derives its own from
    # max_message_size_bytes (gateway/config/settings.py).
    max_record_bytes: int = max_record_bytes_for(16 << 20)
    flush: FlushPolicy = FlushPolicy.SYNC
    async_flush_interval_ms: int = 500
    offset_persist_interval_ms: int = 5_000
    checkpoint_interval_ms: int = 1_000
    # Age-based deletion of unread data is opt-in (RocketMQ's trade-off, not RabbitMQ's):
    # None keeps every record until every queue has consumed it.
    retention_ms: int | None = None
    # Consumed segments stay at least this long (replay, streams); 0: go at once.
    min_retention_ms: int = 0
    disk_budget_bytes: int | None = None  # the gateway blocks publishers above it
    retention_check_interval_ms: int = 10_000
    # Copy-forward collection (storage/log/collector.py): relocate the head segment's live
    # records when they are at most this share of a segment (0 turns it off), copying at
    # most this many bytes per second.
    gc_max_live_ratio: float = 0.5
    gc_copy_rate_bytes: int = 32 << 20
    # An active segment this large whose records are consumed is sealed early (and then
    # reclaimed), so that draining a queue frees the disk; 0 keeps segments whole.
    roll_consumed_bytes: int = 16 << 20
    verify_crc_on_read: bool = True
    # A fan-out's records, decoded by the first queue to read them back, are kept for the
    # others' reads up to about this many bytes (storage/log/recent_records.py); 0: none.
    recent_records_bytes: int = 16 << 20
