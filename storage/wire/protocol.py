"""The broker protocol, sans-IO: requests and responses to and from frame payloads.

Nothing here awaits or touches a socket. storage/broker/server.py (server) and
storage/clients/remote.py (client) read, feed a ``FrameDecoder`` (wire_frames.py: framing) and
write what the encoders here return; wire_errors.py carries the typed errors.
docs/broker-protocol.md explains the protocol; these three modules are its source of truth.

Every frame is ``u32 length | u32 request id | u8 op | payload``. A response carries its
request's id and op, or op ERROR. The broker answers requests as they complete, not in
order, so the id is the only link between a request and its answer (pipelining: many
requests in flight per connection).

Batches cross the seam, not messages: an APPEND carries a list of records and a READ answer
a list of messages, each packed with one ``struct`` call plus its byte fields. No JSON, no
pickle, no per-message dict. Decoded messages are memoryview slices of the frame (the frame
is immutable bytes, so the slices stay valid for as long as anyone holds them).

Decoding validates every length against the frame: a short or over-long payload raises
``ProtocolError`` (the peer is broken or hostile; the connection is closed), never IndexError
or a silently truncated slice.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import Any, NamedTuple

from storage.record import Record, StoredMessage
from storage.results import (
    AppendResult,
    DeliveryProgress,
    PartitionStats,
    QueueStats,
    ReadResult,
    ReadStatus,
    RetentionReport,
)
from storage.wire.errors import ERROR_OP, decode_error
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
    Replicated,
    get_replicate,
    get_replicated,
    put_replicate,
    put_replicated,
)

# 2: APPEND carries a batch id; REPLICATE. 3: fencing tokens on offset commits and reads,
# length limits on APPEND (refusals in its answer), READ's wait_ms. 4: byte limits on APPEND,
# DeliveryProgress on offset commits and in queue stats. 5: the highest fence per partition in
# queue stats (a new lease holder checks its predecessor's note against it). 6: READ carries
# the reader's fencing token (a replaced lease holder reads nothing more to deliver).
PROTOCOL_VERSION = 6
NO_PROGRESS = DeliveryProgress(-1)  # how a commit without a progress report travels
# APPEND: wait_durable, record count, batch id (0: none); per record: exchange, routing key,
# destination count, properties and body lengths, born_ts_ms, flags; then destinations, then
# the byte fields; then the length limits: u16 count, per queue u32 id and q max length;
# then the byte limits, laid out the same with q max length bytes.
APPEND_HEAD = struct.Struct("<?IQ")
LIMIT = struct.Struct("<Iq")  # queue id, max length or max length bytes (reject-publish)
REFUSED = struct.Struct("<IIH")  # record index, queue id, partition
RECORD = struct.Struct("<HHHIIqI")
DEST = struct.Struct("<IH")  # queue id, partition
# READ answer: status, next offset, min, max, message count; per message as below.
READ_HEAD = struct.Struct("<BqqqI")
MESSAGE = struct.Struct("<qqHHIIqqI")  # queue/commit offsets, 4 lengths, born, stored, flags
APPEND_RESULT = struct.Struct("<qqIqI")  # start, end, count, store_ts_ms, offsets count
QUEUE_START = struct.Struct("<IHq")
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
# What each op answers with (decode_response returns it): see _RESPONSES below.
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


# -- append --------------------------------------------------------------------------------


def _put_append(parts: list[Any], request: Append) -> None:
    records = request.records
    parts.append(APPEND_HEAD.pack(request.wait_durable, len(records), request.batch_id))
    pack = RECORD.pack
    last: tuple[tuple[int, int], ...] | None = None
    packed = b""
    for exchange, routing_key, properties, body, dests, born, flags in records:
        if dests is not last:  # batches usually repeat one destination tuple
            packed = b"".join([DEST.pack(q, p) for q, p in dests])
            last = dests
        head = pack(
            len(exchange), len(routing_key), len(dests), len(properties), len(body), born, flags
        )
        parts += (head, packed, exchange, routing_key, properties, body)
    parts.append(U16.pack(len(request.limits)))
    parts += [LIMIT.pack(queue_id, limit) for queue_id, limit in request.limits]
    parts.append(U16.pack(len(request.byte_limits)))
    parts += [LIMIT.pack(queue_id, limit) for queue_id, limit in request.byte_limits]


def _get_append(reader: PayloadReader) -> Append:
    # One copy of the payload, then bytes slices: a slice of bytes is one C call, where a
    # view slice plus tobytes() is two (the fields must be bytes: Record says so).
    data = reader.buf.tobytes()
    end = len(data)
    wait, count, batch_id = APPEND_HEAD.unpack_from(data, 0)
    pos = APPEND_HEAD.size
    records: list[Record] = []
    append = records.append
    make = tuple.__new__  # skips the NamedTuple's Python-level __new__ frame
    unpack = RECORD.unpack_from
    head_size = RECORD.size
    dest_size = DEST.size
    last_raw = b""
    dests: tuple[tuple[int, int], ...] = ()
    for _ in range(count):
        ex_len, key_len, dest_count, props_len, body_len, born, flags = unpack(data, pos)
        pos += head_size
        p = pos + dest_size * dest_count
        raw = data[pos:p]
        if raw != last_raw:  # equal lists share one tuple, as the store's dest cache expects
            dests = tuple(DEST.iter_unpack(raw))
            last_raw = raw
        q = p + ex_len
        r = q + key_len
        s = r + props_len
        pos = s + body_len
        if pos > end:
            raise ProtocolError("record runs past the end of the frame")
        append(make(Record, (data[p:q], data[q:r], data[r:s], data[s:pos], dests, born, flags)))
    (count,) = U16.unpack_from(data, pos)
    pos += U16.size
    limits, pos = _items(data, pos, count, LIMIT, "length limits")
    (count,) = U16.unpack_from(data, pos)
    pos += U16.size
    byte_limits, reader.pos = _items(data, pos, count, LIMIT, "byte limits")
    return Append(records, wait, batch_id, limits, byte_limits)


def _items(
    buf: bytes | memoryview, pos: int, count: int, item: struct.Struct, what: str
) -> tuple[list[tuple[Any, ...]], int]:
    """``count`` fixed-size items at ``pos``, and the position after them."""
    end = pos + item.size * count
    items = list(item.iter_unpack(buf[pos:end]))
    if len(items) != count:
        raise ProtocolError(f"{what} run past the end of the frame")
    return items, end


def _put_append_result(parts: list[Any], result: AppendResult) -> None:
    offsets = result.record_offsets
    start, end, count, _, starts, store_ts, refused = result
    parts += (
        APPEND_RESULT.pack(start, end, count, store_ts, len(offsets)),
        struct.pack(f"<{len(offsets)}q", *offsets),
    )
    if starts is None:
        parts.append(b"\x00")
    else:
        parts.append(b"\x01" + FRAME_LEN.pack(len(starts)))
        parts += [QUEUE_START.pack(q, p, offset) for (q, p), offset in starts.items()]
    parts.append(FRAME_LEN.pack(len(refused)))
    parts += [REFUSED.pack(*one) for one in refused]


def _get_append_result(reader: PayloadReader) -> AppendResult:
    buf = reader.buf
    start, end, count, store_ts, n = APPEND_RESULT.unpack_from(buf, 0)
    pos = APPEND_RESULT.size
    offsets = struct.unpack_from(f"<{n}q", buf, pos)
    pos += 8 * n
    starts: dict[tuple[int, int], int] | None = None
    if buf[pos]:
        (m,) = FRAME_LEN.unpack_from(buf, pos + 1)
        pos += 5
        starts = {}
        for q, p, offset in QUEUE_START.iter_unpack(buf[pos : pos + QUEUE_START.size * m]):
            starts[(q, p)] = offset
        pos += QUEUE_START.size * m
    else:
        pos += 1
    (m,) = FRAME_LEN.unpack_from(buf, pos)
    pos += FRAME_LEN.size
    refused, reader.pos = _items(buf, pos, m, REFUSED, "refused destinations")
    return AppendResult(start, end, count, offsets, starts, store_ts, tuple(refused))


# -- read ----------------------------------------------------------------------------------

_STATUSES = tuple(ReadStatus)
_STATUS_CODES = {status: index for index, status in enumerate(_STATUSES)}


def _put_read_result(parts: list[Any], result: ReadResult) -> None:
    status, messages, next_offset, low, high = result
    parts.append(READ_HEAD.pack(_STATUS_CODES[status], next_offset, low, high, len(messages)))
    pack = MESSAGE.pack
    for queue_offset, commit, exchange, key, props, body, born, stored, flags in messages:
        head = pack(
            queue_offset,
            commit,
            len(exchange),
            len(key),
            len(props),
            len(body),
            born,
            stored,
            flags,
        )
        parts += (head, exchange, key, props, body)


def _get_read_result(reader: PayloadReader) -> ReadResult:
    buf = reader.buf
    status, next_offset, low, high, count = READ_HEAD.unpack_from(buf, 0)
    pos = READ_HEAD.size
    messages: list[StoredMessage] = []
    append = messages.append
    make = tuple.__new__
    unpack = MESSAGE.unpack_from
    head_size = MESSAGE.size
    for _ in range(count):
        queue_offset, commit, ex_len, key_len, props_len, body_len, born, stored, flags = unpack(
            buf, pos
        )
        p = pos + head_size
        q = p + ex_len
        r = q + key_len
        s = r + props_len
        pos = s + body_len
        if pos > len(buf):
            raise ProtocolError("message runs past the end of the frame")
        # properties and body stay views of the frame: no copy per message.
        exchange, key = buf[p:q].tobytes(), buf[q:r].tobytes()
        fields = (queue_offset, commit, exchange, key, buf[r:s], buf[s:pos], born, stored, flags)
        append(make(StoredMessage, fields))
    reader.pos = pos
    return ReadResult(_STATUSES[status], messages, next_offset, low, high)


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
    Op.APPEND: _Codec(_put_append, _get_append, _put_append_result, _get_append_result),
    Op.WAIT_DURABLE: _Codec(*_fixed(WaitDurable, I64), _put_none, _get_none),
    Op.READ: _Codec(*_fixed(Read, READ_ARGS), _put_read_result, _get_read_result),
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
