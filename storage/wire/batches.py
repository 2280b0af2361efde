"""The broker protocol's hot payloads: APPEND (records in, AppendResult out) and READ's answer.

Batches cross the seam, not messages: an APPEND carries a list of records and a READ answer
a list of messages, each packed with one ``struct`` call plus its byte fields, in loops that
bind what they call to locals. Decoded messages are memoryview slices of the frame (the frame
is immutable bytes, so the slices stay valid for as long as anyone holds them). Every length
is checked against the frame: a short payload raises ``ProtocolError``. storage/wire/protocol.py
files these codecs under their ops.
"""

from __future__ import annotations

import struct
from typing import Any

from storage.record import Record, StoredMessage
from storage.results import AppendResult, ReadResult, ReadStatus
from storage.wire.frames import FRAME_LEN, U16, PayloadReader, ProtocolError
from storage.wire.requests import Append

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
READ_HEAD = struct.Struct("<BqqqIqq")  # ..., count, replaced_fence, replaced_end
MESSAGE = struct.Struct("<qqHHIIqqI")  # queue/commit offsets, 4 lengths, born, stored, flags
APPEND_RESULT = struct.Struct("<qqIqI")  # start, end, count, store_ts_ms, offsets count
QUEUE_START = struct.Struct("<IHq")


# -- append --------------------------------------------------------------------------------


def put_append(parts: list[Any], request: Append) -> None:
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


def get_append(reader: PayloadReader) -> Append:
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


def put_append_result(parts: list[Any], result: AppendResult) -> None:
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


def get_append_result(reader: PayloadReader) -> AppendResult:
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


def put_read_result(parts: list[Any], result: ReadResult) -> None:
    status, messages, next_offset, low, high, replaced, replaced_end = result
    code = _STATUS_CODES[status]
    parts.append(
        READ_HEAD.pack(code, next_offset, low, high, len(messages), replaced, replaced_end)
    )
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


def get_read_result(reader: PayloadReader) -> ReadResult:
    buf = reader.buf
    status, next_offset, low, high, count, replaced, replaced_end = READ_HEAD.unpack_from(buf, 0)
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
    return ReadResult(_STATUSES[status], messages, next_offset, low, high, replaced, replaced_end)
