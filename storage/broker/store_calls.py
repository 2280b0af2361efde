"""What a broker connection reaches in the store it serves.

The calls answered as soon as the store returns, per request type (a request's fields are the
store method's arguments) and per argument-less query op; and, under a plain or a replicated
store, the log views the broker's append checks count over: the running sums of body bytes of
byte-limited queues (storage/broker/limits.py: ReadyBytes) and the live set of closed
partitions (storage/log/closed_partitions.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Set
from typing import Any

from storage.broker.limits import ReadyBytes
from storage.log.embedded import EmbeddedStore
from storage.port import StorePort
from storage.record import Destination
from storage.replication.replicated_store import ReplicatedStore
from storage.results import DeliveryProgress
from storage.wire.requests import (
    CommitOffsets,
    CommittedOffset,
    CreateQueue,
    DeleteQueue,
    GetQueueStats,
    OffsetForTime,
    Op,
    Purge,
    Read,
    Response,
    RestartMarks,
    UncleanMarks,
)


async def _commit_offsets(store: StorePort, request: CommitOffsets) -> None:
    for group, queue_id, partition, offset, fence, *report in request.commits:
        progress = DeliveryProgress(*report) if report[0] >= 0 else None
        await store.commit_offset(group, queue_id, partition, offset, fence, progress)


# The calls answered as soon as they return (request fields are the method's arguments).
STORE_CALLS: dict[type[Any], Callable[[StorePort, Any], Awaitable[Response]]] = {
    Read: lambda store, r: store.read(*r),
    CreateQueue: lambda store, r: store.create_queue(*r),
    DeleteQueue: lambda store, r: store.delete_queue(*r),
    Purge: lambda store, r: store.purge(*r),
    GetQueueStats: lambda store, r: store.queue_stats(*r),
    CommitOffsets: _commit_offsets,
    CommittedOffset: lambda store, r: store.committed_offset(*r),
    OffsetForTime: lambda store, r: store.offset_for_time(*r),
    UncleanMarks: lambda store, r: store.unclean_marks(*r),
    RestartMarks: lambda store, r: store.restart_marks(*r),
}
QUERY_CALLS: dict[Op, Callable[[StorePort], Awaitable[Response]]] = {
    Op.BACKLOG_BYTES: lambda store: store.backlog_bytes(),
    Op.QUEUES: lambda store: store.queues(),
    Op.APPLY_RETENTION: lambda store: store.apply_retention(),
    Op.DISK_BYTES: lambda store: store.disk_bytes(),
    Op.HELD_BACK_BYTES: lambda store: store.held_back_bytes(),
    Op.OLDEST_SEGMENT_TS: lambda store: store.oldest_segment_ts(),
}


def ready_bytes_of(store: StorePort, replicated: ReplicatedStore | None) -> ReadyBytes:
    """Byte-limit sums over the whole log: a replicated master reads past its confirm
    offset, and starts its sums anew at each role epoch."""
    if replicated is None:
        return ReadyBytes(store)
    return ReadyBytes(replicated.inner, lambda: replicated.role_epoch)


def closed_of(store: StorePort, replicated: ReplicatedStore | None) -> Set[Destination]:
    """The closed partitions of the log under ``store``: the live set, changed in place."""
    under = store if replicated is None else replicated
    if isinstance(under, ReplicatedStore):
        return under.inner.log.closed
    if isinstance(under, EmbeddedStore):
        return under.log.closed
    return frozenset()
