"""A fan-out's records, as one queue's read decoded them, for the other queues' reads.

A fan-out stores one record for all its queues, and each queue that falls behind its
publisher reads its messages back for itself: without this, every one of them would fetch
the same bytes again, check their CRC and decode them. The first read of a record with more
than one destination keeps it here, decoded (storage/record_decode.py's decode_run); the
others take it as it was kept (take_kept). Records for one queue are never kept.

Two generations bound what is kept: what reads keep goes into ``young``; once it holds half
of ``limit_bytes`` (counted as the reads' buffers, which the kept views hold alive), it
becomes ``old`` and the old one goes. A record reused at its commit offset would be served
stale, so a truncation of the commitlog clears both (CommitLog.truncate_from).
"""

from __future__ import annotations

from storage.record_decode import KeptRecord

# Enough for ten queues a few thousand 1 KB records apart.
DEFAULT_LIMIT_BYTES = 16 << 20


class RecentRecords:
    """Commit offset -> the record as a read decoded it, for about ``limit_bytes``."""

    def __init__(self, limit_bytes: int = DEFAULT_LIMIT_BYTES) -> None:
        self.limit_bytes = limit_bytes
        self.young: dict[int, KeptRecord] = {}
        self.old: dict[int, KeptRecord] = {}
        self.young_bytes = 0

    def __len__(self) -> int:
        return len(self.young) + len(self.old)

    @property
    def keeping(self) -> bool:
        return self.limit_bytes > 0

    def kept(self, read_bytes: int) -> None:
        """A read of ``read_bytes`` kept records in ``young``: age it once it is full."""
        self.young_bytes += read_bytes
        if self.young_bytes * 2 >= self.limit_bytes:
            self.old = self.young
            self.young = {}
            self.young_bytes = 0

    def clear(self) -> None:
        self.young = {}
        self.old = {}
        self.young_bytes = 0
