"""Typed errors raised by the log store.

Each carries enough detail for an operator log line; the gateway maps them to AMQP answers
(a refused append becomes basic.nack or a precondition failure, never a traceback).
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error the store raises on purpose."""


class RecordTooLarge(StoreError):
    """A record is over the configured maximum; nothing was written."""

    def __init__(self, size_bytes: int, max_bytes: int) -> None:
        super().__init__(f"record of {size_bytes} bytes exceeds the maximum of {max_bytes} bytes")
        self.size_bytes = size_bytes
        self.max_bytes = max_bytes


class StoreWriteError(StoreError):
    """Writing or syncing failed; the append was rolled back and nothing of it is visible."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class DiskFull(StoreWriteError):
    """ENOSPC (or the disk budget) stopped an append; appends succeed again once space returns."""


class UnknownQueue(StoreError):
    """The queue id (or partition) does not exist in this store."""

    def __init__(self, queue_id: int, partition: int | None = None) -> None:
        where = f"queue {queue_id}" if partition is None else f"queue {queue_id}/{partition}"
        super().__init__(f"unknown {where}")
        self.queue_id = queue_id
        self.partition = partition


class QueueExists(StoreError):
    """No longer raised: create_queue grows a queue instead of refusing another partition
    count. Kept so that the wire codec still decodes it from a broker of an older version."""


class CorruptionError(StoreError):
    """A record before the end of the log failed its checks: reported, never skipped silently."""

    def __init__(self, segment: str, offset: int, reason: str) -> None:
        super().__init__(f"corrupt record in {segment} at commitlog offset {offset}: {reason}")
        self.segment = segment
        self.offset = offset
        self.reason = reason


class StoreLocked(StoreError):
    """Another process holds the store directory."""


class StoreClosed(StoreError):
    """The store was used after close()."""


class NotMaster(StoreError):
    """This broker does not confirm for its group now (a slave, fenced, no standing, or below
    the minimum in-sync replicas). Nothing was stored by this call, or what was stored is not
    confirmed: a gateway re-sends the batch to the group's master."""


class StaleFence(StoreError):
    """An offset commit (or a take-over read) carried a fencing token lower than the highest
    one seen for its (group, queue, partition): a newer lease holder delivers that partition
    now. Nothing was changed."""
