"""The broker protocol, sans-IO: requests and responses to and from frame payloads.

Nothing here awaits or touches a socket. storage/broker/ (server) and storage/clients/remote.py
(client) read, feed a ``FrameDecoder`` (storage/wire/frames.py: framing) and write what the
encoders here return; storage/wire/errors.py carries the typed errors. The ops and request
types are storage/wire/requests.py's, the hot APPEND and READ payloads storage/wire/batches.py's;
this module holds the other payloads, the table of codecs per op and the entry points.
docs/broker-protocol.md explains the protocol; these modules are its source of truth.

Every frame is ``u32 length | u32 request id | u8 op | payload``. A response carries its
request's id and op, or op ERROR. The broker answers requests as they complete, not in
order, so the id is the only link between a request and its answer (pipelining: many
requests in flight per connection).

Decoding validates every length against the frame: a short or over-long payload raises
``ProtocolError`` (the peer is broken or hostile; the connection is closed), never IndexError
or a silently truncated slice.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, NamedTuple

from storage.results import PartitionStats, QueueStats, RetentionReport
from storage.wire.batches import (
    get_append,
    get_append_result,
    get_read_result,
    put_append,
    put_append_result,
    put_read_result,
)
from storage.wire.errors import decode_error
from storage.wire.frames import (
    FRAME_LEN,
    I64,
    U16,
    Frame,
    PayloadReader,
    ProtocolError,
    build_frame,
    pack_text,
)
from storage.wire.replication import (
    Replicate,
    get_replicate,
    get_replicated,
    put_replicate,
    put_replicated,
)
from storage.wire.requests import (
    Append,
    CommitOffsets,
    CommittedOffset,
    CreateQueue,
    DeleteQueue,
    GetQueueStats,
    Hello,
    OffsetCommit,
    OffsetForTime,
    Op,
    Purge,
    Query,
    Read,
    Request,
    Response,
    RestartMarks,
    UncleanMarks,
    WaitDurable,
)

STATS_HEAD = struct.Struct("<IqqH")  # queue id, ready, dropped, partition count
PARTITION = struct.Struct("<HqqqqqqIqq")  # PartitionStats, field by field
RETENTION = struct.Struct("<qq")  # deleted segments, freed bytes; then dropped per queue
ID_VALUE = struct.Struct("<Iq")  # a dict[int, int] entry (queues, held-back bytes)
# Request arguments are as wide as Python lets a caller pass them: an out-of-range partition
# is the store's UnknownQueue over the wire too, not an encoding error.
# queue id, partition, offset, max count and bytes, wait ms, fence
READ_ARGS = struct.Struct("<IIqIqIq")
# queue id, partition, offset, fencing token; then DeliveryProgress (next offset -1: none)
COMMIT_ARGS = struct.Struct("<IIqqqqI")
QUEUE_ARGS = struct.Struct("<II")  # queue id, partition (or partition count)
OFFSET_ARGS = struct.Struct("<IIq")  # queue id, partition, offset (or timestamp, or fence)


# -- the other requests and answers (cold paths) -------------------------------------------


def _put_commits(parts: list[Any], request: CommitOffsets) -> None:
    parts.append(FRAME_LEN.pack(len(request.commits)))
    for group, *args in request.commits:
        parts += (pack_text(group), COMMIT_ARGS.pack(*args))


def _get_commits(r: PayloadReader) -> CommitOffsets:
    (count,) = r.take(FRAME_LEN)
    return CommitOffsets([OffsetCommit(r.text(), *r.take(COMMIT_ARGS)) for _ in range(count)])


def _put_id_values(parts: list[Any], values: dict[int, int]) -> None:
    parts.append(FRAME_LEN.pack(len(values)))
    parts += [ID_VALUE.pack(key, value) for key, value in values.items()]


def _get_id_values(r: PayloadReader) -> dict[int, int]:
    (count,) = r.take(FRAME_LEN)
    return dict(r.take(ID_VALUE) for _ in range(count))


def _put_stats(parts: list[Any], stats: QueueStats) -> None:
    parts.append(
        STATS_HEAD.pack(
            stats.queue_id, stats.ready, stats.dropped_by_retention, len(stats.partitions)
        )
    )
    parts += [PARTITION.pack(*partition) for partition in stats.partitions]


def _get_stats(r: PayloadReader) -> QueueStats:
    queue_id, ready, dropped, count = r.take(STATS_HEAD)
    partitions = [PartitionStats(*r.take(PARTITION)) for _ in range(count)]
    return QueueStats(queue_id, partitions, ready, dropped)


def _put_retention(parts: list[Any], report: RetentionReport) -> None:
    parts.append(RETENTION.pack(report.deleted_segments, report.freed_bytes))
    _put_id_values(parts, report.dropped_unread)


def _get_retention(r: PayloadReader) -> RetentionReport:
    deleted, freed = r.take(RETENTION)
    return RetentionReport(deleted, freed, _get_id_values(r))


_Put = Callable[[list[Any], Any], None]
_Get = Callable[[PayloadReader], Any]


def _put_hello(parts: list[Any], hello: Hello) -> None:
    parts += (U16.pack(hello.version), pack_text(hello.name))


def _get_hello(r: PayloadReader) -> Hello:
    return Hello(r.take(U16)[0], r.text())


def _put_int(parts: list[Any], value: int) -> None:
    parts.append(I64.pack(value))


def _get_int(r: PayloadReader) -> int:
    value: int = r.take(I64)[0]
    return value


def _put_optional_int(parts: list[Any], value: int | None) -> None:
    parts.append(I64.pack(-1 if value is None else value))  # -1: none (offsets/ts are >= 0)


def _get_optional_int(r: PayloadReader) -> int | None:
    value: int = r.take(I64)[0]
    return None if value < 0 else value


def _put_none(parts: list[Any], value: None) -> None:
    """Nothing to say but "done"."""


def _get_none(r: PayloadReader) -> None:
    return None


def _put_group_queue(parts: list[Any], request: Purge | GetQueueStats) -> None:
    parts += (FRAME_LEN.pack(request.queue_id), pack_text(request.group))


def _group_queue(kind: type[Purge] | type[GetQueueStats]) -> _Get:
    return lambda r: kind(r.take(FRAME_LEN)[0], r.text())


def _put_committed(parts: list[Any], request: CommittedOffset) -> None:
    fields = (request.queue_id, request.partition, request.fence)
    parts += (pack_text(request.group), OFFSET_ARGS.pack(*fields))


def _get_committed(r: PayloadReader) -> CommittedOffset:
    group = r.text()
    return CommittedOffset(group, *r.take(OFFSET_ARGS))


def _fixed(kind: Any, layout: struct.Struct) -> tuple[_Put, _Get]:
    """Codec of a request made of fixed-size numbers, in field order."""
    return (lambda parts, request: parts.append(layout.pack(*request))), (
        lambda r: kind(*r.take(layout))
    )


def _get_query(op: Op) -> _Get:
    return lambda r: Query(op)


class _Codec(NamedTuple):
    put_request: _Put
    get_request: _Get
    put_response: _Put
    get_response: _Get


_CODECS: dict[Op, _Codec] = {
    Op.HELLO: _Codec(_put_hello, _get_hello, _put_hello, _get_hello),
    Op.APPEND: _Codec(put_append, get_append, put_append_result, get_append_result),
    Op.WAIT_DURABLE: _Codec(*_fixed(WaitDurable, I64), _put_none, _get_none),
    Op.READ: _Codec(*_fixed(Read, READ_ARGS), put_read_result, get_read_result),
    Op.CREATE_QUEUE: _Codec(*_fixed(CreateQueue, QUEUE_ARGS), _put_none, _get_none),
    Op.DELETE_QUEUE: _Codec(*_fixed(DeleteQueue, FRAME_LEN), _put_none, _get_none),
    Op.PURGE: _Codec(_put_group_queue, _group_queue(Purge), _put_int, _get_int),
    Op.QUEUE_STATS: _Codec(_put_group_queue, _group_queue(GetQueueStats), _put_stats, _get_stats),
    Op.COMMIT_OFFSETS: _Codec(_put_commits, _get_commits, _put_none, _get_none),
    Op.COMMITTED_OFFSET: _Codec(_put_committed, _get_committed, _put_int, _get_int),
    Op.OFFSET_FOR_TIME: _Codec(*_fixed(OffsetForTime, OFFSET_ARGS), _put_int, _get_int),
    Op.BACKLOG_BYTES: _Codec(_put_none, _get_query(Op.BACKLOG_BYTES), _put_int, _get_int),
    Op.QUEUES: _Codec(_put_none, _get_query(Op.QUEUES), _put_id_values, _get_id_values),
    Op.APPLY_RETENTION: _Codec(
        _put_none, _get_query(Op.APPLY_RETENTION), _put_retention, _get_retention
    ),
    Op.DISK_BYTES: _Codec(_put_none, _get_query(Op.DISK_BYTES), _put_int, _get_int),
    Op.HELD_BACK_BYTES: _Codec(
        _put_none, _get_query(Op.HELD_BACK_BYTES), _put_id_values, _get_id_values
    ),
    Op.OLDEST_SEGMENT_TS: _Codec(
        _put_none, _get_query(Op.OLDEST_SEGMENT_TS), _put_optional_int, _get_optional_int
    ),
    Op.UNCLEAN_MARKS: _Codec(*_fixed(UncleanMarks, FRAME_LEN), _put_id_values, _get_id_values),
    Op.RESTART_MARKS: _Codec(*_fixed(RestartMarks, FRAME_LEN), _put_id_values, _get_id_values),
    Op.REPLICATE: _Codec(put_replicate, get_replicate, put_replicated, get_replicated),
}
_REQUEST_OPS: dict[type[Any], Op] = {
    Hello: Op.HELLO,
    Append: Op.APPEND,
    WaitDurable: Op.WAIT_DURABLE,
    Read: Op.READ,
    CreateQueue: Op.CREATE_QUEUE,
    DeleteQueue: Op.DELETE_QUEUE,
    Purge: Op.PURGE,
    GetQueueStats: Op.QUEUE_STATS,
    CommitOffsets: Op.COMMIT_OFFSETS,
    CommittedOffset: Op.COMMITTED_OFFSET,
    OffsetForTime: Op.OFFSET_FOR_TIME,
    UncleanMarks: Op.UNCLEAN_MARKS,
    RestartMarks: Op.RESTART_MARKS,
    Replicate: Op.REPLICATE,
}


def request_op(request: Request) -> Op:
    return request.op if isinstance(request, Query) else _REQUEST_OPS[type(request)]


def encode_request(request_id: int, request: Request) -> bytes:
    op = request_op(request)
    parts: list[Any] = [b""]
    try:
        _CODECS[op].put_request(parts, request)
    except (struct.error, OverflowError) as error:
        raise ProtocolError(f"cannot encode {op.name}: {error}") from None
    return build_frame(request_id, op, parts)


def encode_response(request_id: int, op: Op, value: Response) -> bytes:
    """The answer to request ``op``; ``value`` is what the store call returned."""
    parts: list[Any] = [b""]
    _CODECS[op].put_response(parts, value)
    return build_frame(request_id, op, parts)


def _decode(frame: Frame, request: bool) -> Any:
    try:
        codec = _CODECS[Op(frame.op)]
        reader = PayloadReader(frame.payload)
        value = (codec.get_request if request else codec.get_response)(reader)
        reader.done()
        return value
    except (struct.error, ValueError, KeyError, IndexError) as error:
        # ValueError covers an unknown op, bad UTF-8 and a bad status code.
        raise ProtocolError(f"malformed frame (op {frame.op}): {error}") from None


def decode_request(frame: Frame) -> Request:
    if frame.op == Op.ERROR:
        raise ProtocolError("an ERROR frame is not a request")
    request: Request = _decode(frame, request=True)
    return request


def decode_response(frame: Frame) -> Response:
    """The value answered, or raises the error the broker answered with."""
    if frame.op == Op.ERROR:
        raise decode_error(frame.payload)
    response: Response = _decode(frame, request=False)
    return response
