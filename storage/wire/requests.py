"""The broker protocol's vocabulary: its version, ops, request types and answer types.

Each request is a NamedTuple whose fields are the store call's arguments, in order (the
broker passes them straight on); ``Query`` stands for the calls without arguments. The
payload codecs (storage/wire/batches.py for the hot APPEND and READ, storage/wire/protocol.py
for the rest and the entry points) turn these to and from frames; nothing here encodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import NamedTuple

from storage.record import Record
from storage.results import (
    AppendResult,
    DeliveryProgress,
    QueueStats,
    ReadResult,
    RetentionReport,
)
from storage.wire.errors import ERROR_OP
from storage.wire.replication import Replicate, Replicated

# 2: APPEND carries a batch id; REPLICATE. 3: fencing tokens on offset commits and reads,
# length limits on APPEND (refusals in its answer), READ's wait_ms. 4: byte limits on APPEND,
# DeliveryProgress on offset commits and in queue stats. 5: the highest fence per partition in
# queue stats (a new lease holder checks its predecessor's note against it). 6: READ carries
# the reader's fencing token (a replaced lease holder reads nothing more to deliver).
# 7: a fenced READ answers the fence it replaced at that copy and the end then.
PROTOCOL_VERSION = 7
NO_PROGRESS = DeliveryProgress(-1)  # how a commit without a progress report travels


class Op(IntEnum):
    HELLO = 0
    APPEND = 1
    WAIT_DURABLE = 2
    BACKLOG_BYTES = 3
    READ = 4
    CREATE_QUEUE = 5
    QUEUES = 6
    DELETE_QUEUE = 7
    PURGE = 8
    QUEUE_STATS = 9
    COMMIT_OFFSETS = 10
    COMMITTED_OFFSET = 11
    OFFSET_FOR_TIME = 12
    APPLY_RETENTION = 13
    DISK_BYTES = 14
    HELD_BACK_BYTES = 15
    OLDEST_SEGMENT_TS = 16
    UNCLEAN_MARKS = 17
    RESTART_MARKS = 18
    REPLICATE = 19  # storage/wire/replication.py
    ERROR = ERROR_OP  # response only


# -- requests ------------------------------------------------------------------------------


class Hello(NamedTuple):
    """First request of a connection; the answer is a Hello too (the broker's)."""

    version: int
    name: str  # the client's (or broker's) name, for log lines


class Append(NamedTuple):
    records: Sequence[Record]
    wait_durable: bool
    # Names the batch so that a gateway re-sending it after a failover has it stored once
    # (a replicated broker remembers recent ids); 0: no id.
    batch_id: int = 0
    # (queue id, max length): x-max-length reject-publish of the queues the batch reaches;
    # the broker refuses the destinations that would pass it (AppendResult.refused).
    limits: Sequence[tuple[int, int]] = ()
    # (queue id, max length bytes): x-max-length-bytes reject-publish, checked the same way
    # against the body bytes after the queue's committed offset.
    byte_limits: Sequence[tuple[int, int]] = ()


class WaitDurable(NamedTuple):
    end_offset: int


class Read(NamedTuple):
    queue_id: int
    partition: int
    offset: int
    max_count: int
    max_bytes: int
    wait_ms: int = 0  # hold the read (up to this) while the partition has nothing new
    fence: int = 0  # the reader's fencing token in QUEUE_GROUP (0: unfenced)


class CreateQueue(NamedTuple):
    queue_id: int
    partitions: int


class DeleteQueue(NamedTuple):
    queue_id: int


class Purge(NamedTuple):
    queue_id: int
    group: str


class GetQueueStats(NamedTuple):
    queue_id: int
    group: str


class OffsetCommit(NamedTuple):
    group: str
    queue_id: int
    partition: int
    offset: int
    fence: int = 0  # the committer's fencing token (0: unfenced)
    next_offset: int = -1  # then the committer's DeliveryProgress (-1: none)
    ready_behind: int = 0
    takers: int = 0


class CommitOffsets(NamedTuple):
    """Applied in order; the first failing entry stops the batch and is the answer (the ones
    before it stay applied: a commit is an idempotent overwrite, so re-sending is safe)."""

    commits: Sequence[OffsetCommit]


class CommittedOffset(NamedTuple):
    group: str
    queue_id: int
    partition: int
    fence: int = 0  # a new lease holder's token, registered by this read


class OffsetForTime(NamedTuple):
    queue_id: int
    partition: int
    ts_ms: int


class UncleanMarks(NamedTuple):
    queue_id: int


class RestartMarks(NamedTuple):
    queue_id: int


class Query(NamedTuple):
    """A request without arguments: BACKLOG_BYTES, QUEUES, APPLY_RETENTION, DISK_BYTES,
    HELD_BACK_BYTES, OLDEST_SEGMENT_TS."""

    op: Op


Request = (
    Hello
    | Append
    | WaitDurable
    | Read
    | CreateQueue
    | DeleteQueue
    | Purge
    | GetQueueStats
    | CommitOffsets
    | CommittedOffset
    | OffsetForTime
    | UncleanMarks
    | RestartMarks
    | Replicate
    | Query
)
QUERY_OPS = frozenset(
    {
        Op.BACKLOG_BYTES,
        Op.QUEUES,
        Op.APPLY_RETENTION,
        Op.DISK_BYTES,
        Op.HELD_BACK_BYTES,
        Op.OLDEST_SEGMENT_TS,
    }
)
# What each op answers with (decode_response returns it): see protocol.py's _CODECS.
Response = (
    Hello
    | AppendResult
    | ReadResult
    | QueueStats
    | RetentionReport
    | Replicated
    | dict[int, int]
    | int
    | None
)
