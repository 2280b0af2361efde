"""StorePort: the store API the gateway calls, whatever carries it.

Two implementations satisfy it structurally: ``EmbeddedStore`` (the store in-process) and
``RemoteStore`` (the same calls over the broker protocol to `mqgw broker`). One contract suite,
tests/storage/test_store_contract.py, runs over both; a change here changes both and the suite.

Everything takes and returns whole batches: over the network a call is a round trip, so the
gateway must never need one per message. Errors are the typed ones of storage.errors (plus
``ValueError`` for arguments out of range), raised the same way by both implementations; the
remote one adds ``BrokerUnavailable`` (the outcome of an in-flight call is then unknown).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from storage.record import Record
from storage.results import (
    QUEUE_GROUP,
    AppendResult,
    DeliveryProgress,
    QueueStats,
    ReadResult,
    RetentionReport,
)


class StorePort(Protocol):
    async def append(self, records: Sequence[Record], wait_durable: bool = True) -> AppendResult:
        """Append a batch, all or nothing; with ``wait_durable`` complete once it is durable
        under the flush policy, otherwise once written (readable, ordered): the gateway then
        awaits ``wait_durable(result.end_offset)`` before confirming, so publishes keep
        channel order while their confirms wait for the fsync."""
        ...

    async def wait_durable(self, end_offset: int) -> None:
        """Complete when everything before ``end_offset`` is durable under the flush policy."""
        ...

    async def backlog_bytes(self) -> int:
        """Bytes appended but not yet durable."""
        ...

    async def read(
        self,
        queue_id: int,
        partition: int,
        offset: int,
        max_count: int = 256,
        max_bytes: int = 4 << 20,
        wait_ms: int = 0,
        fence: int = 0,
    ) -> ReadResult:
        """``wait_ms`` > 0: when there is nothing at ``offset`` yet, a broker holds the read
        until the partition has new records, the queue is deleted or purged, or ``wait_ms``
        passed (then NO_NEW_MESSAGE). The embedded store answers at once. ``fence``: the
        reader's fencing token in the queue's own group (QUEUE_GROUP; 0: unfenced):
        StaleFence when a higher one holds the partition, so that a delivering gateway whose
        lease was taken over reads nothing more to deliver."""
        ...

    async def create_queue(self, queue_id: int, partitions: int) -> None:
        """Ensures the queue exists with at least ``partitions`` partitions: creates it, or
        adds empty partitions after the existing ones to reach the count (their offsets start
        at 0, their index files prepared as at creation); a queue with as many or more is left
        as it is. Partitions are never removed here. ValueError unless ``partitions`` is in
        1..65535."""
        ...

    async def queues(self) -> dict[int, int]:
        """Queue id -> partitions, for every queue the store holds."""
        ...

    async def delete_queue(self, queue_id: int) -> None: ...

    async def purge(self, queue_id: int, group: str = QUEUE_GROUP) -> int:
        """Make every stored message of the queue unreadable; returns how many were ready."""
        ...

    async def queue_stats(self, queue_id: int, group: str = QUEUE_GROUP) -> QueueStats: ...

    async def commit_offset(
        self,
        group: str,
        queue_id: int,
        partition: int,
        offset: int,
        fence: int = 0,
        progress: DeliveryProgress | None = None,
    ) -> None:
        """``fence``: the committer's fencing token (a delivery lease's, cluster mode; 0:
        unfenced). The store keeps the highest token seen per (group, queue, partition), with
        the offsets, and refuses a lower one with StaleFence (nothing changes). ``progress``:
        the delivering gateway's position, which queue_stats then counts ready messages from
        (memory only; forgotten on purge and when a higher fencing token arrives)."""
        ...

    async def committed_offset(
        self, group: str, queue_id: int, partition: int, fence: int = 0
    ) -> int:
        """With a ``fence``: admitted and registered as by commit_offset, so that a new
        lease holder's take-over read shuts out the holder it replaced."""
        ...

    def set_append_limit(
        self, queue_id: int, max_length: int | None, max_length_bytes: int | None = None
    ) -> None:
        """x-max-length and x-max-length-bytes with reject-publish for ``queue_id`` (None:
        no limit). A store shared by several gateways sends them with every append reaching
        the queue, and the broker refuses the destinations that would pass one
        (AppendResult.refused); the embedded store leaves the check to the gateway."""
        ...

    async def offset_for_time(self, queue_id: int, partition: int, ts_ms: int) -> int: ...

    async def apply_retention(self) -> RetentionReport: ...

    async def disk_bytes(self) -> int:
        """Bytes of commitlog on disk (what a disk budget is compared with)."""
        ...

    async def held_back_bytes(self) -> dict[int, int]:
        """Per queue with unconsumed records: commitlog bytes it keeps from being reclaimed
        (from its oldest unread record's segment to the end)."""
        ...

    async def oldest_segment_ts(self) -> int | None:
        """Store time of the oldest commitlog segment's last record, when it is sealed
        (messages stored up to then are what deleting that segment would drop)."""
        ...

    async def restart_marks(self, queue_id: int) -> dict[int, int]:
        """Per partition: the index length found when the store opened (what lies below was
        stored by an earlier run: transient messages there are dropped, as RabbitMQ drops
        them at a restart)."""
        ...

    async def unclean_marks(self, queue_id: int) -> dict[int, int]:
        """After a crash, per partition: the index length found at open (messages below may
        have been delivered before it: RabbitMQ flags them redelivered). Empty after a clean
        shutdown."""
        ...
