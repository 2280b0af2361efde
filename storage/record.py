"""CommitLog record format: encode batches, decode one record, recognise the filler.

Layout (little-endian, byte offsets within the record; docs/storage.md has the full table):

    0  u32 total_size        4  u32 magic          8  u32 crc32 of bytes [12, total_size)
    12 u64 physical_offset  20  u64 born_ts_ms    28  u64 store_ts_ms
    36 u32 flags            40  u16 dest_count    42  u8 exchange_len   43 u8 routing_key_len
    44 u32 properties_len   48  u32 body_len
    52 dest_count x (u32 queue_id, u16 partition, u16 reserved)
       exchange, routing_key, properties, body

A copy (magic COPY_MAGIC) is a record the garbage collector moved forward out of a segment it
wanted to delete: the same bytes with a new offset and checksum. Recovery never indexes a copy
as a new message; the consume-queue entries that point at it say so with RELOCATED_ENTRY.

A filler ("blank") closes a segment: total_size spans to the segment's end, magic BLANK_MAGIC,
and it carries the store timestamp of the segment's last record so retention needs no scan.
Batches of records are encoded by storage/record_encode.py (and its compiled twin).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from operator import itemgetter
from typing import NamedTuple

MESSAGE_MAGIC = 0x4D514731  # "1GQM": a message record
BLANK_MAGIC = 0x424C4E4B  # "KNLB": end-of-segment filler
HOLE_MAGIC = 0x454C4F48  # "HOLE": a damaged record replaced by `mqgw storage repair`
COPY_MAGIC = 0x4D59504F  # "OPYM": a message record relocated by the garbage collector

HEAD = struct.Struct("<III")  # total_size, magic, crc
TAIL = struct.Struct("<QQQIHBBII")  # physical_offset … body_len
HEADER = struct.Struct("<IIIQQQIHBBII")
HEADER_SIZE = HEADER.size  # 52
DEST = struct.Struct("<IHH")
DEST_SIZE = DEST.size  # 8
BLANK = struct.Struct("<IIIQQ")  # total_size, magic, crc, physical_offset, last_store_ts_ms
BLANK_SIZE = BLANK.size  # 28
CQ_ENTRY = struct.Struct("<QIQ")  # commitlog offset, size, timestamp
CQ_ENTRY_SIZE = CQ_ENTRY.size  # 20
# High bit of an entry's size: the entry was re-pointed at a copy (records stay below 2 GiB).
# Entries of the original dispatch are in commit order; relocated ones point further ahead.
RELOCATED_ENTRY = 1 << 31
ENTRY_SIZE_MASK = RELOCATED_ENTRY - 1

Destination = tuple[int, int]  # (queue id, partition)


# Record flag bits, defined here only. The store reads PERSISTENT: a persistent message must
# outlive a restart, so the index entries of an append holding one are never held back.
PERSISTENT = 1
EXPIRES = 2  # the message carries an AMQP expiration property (queues check it at the head)
REDELIVERED = 4  # re-entered its queue after a redelivery backoff
CLOSES = 8  # closes its destination partitions: a broker refuses what names them after it


class Record(NamedTuple):
    """A message to append. ``properties`` are the raw AMQP basic-properties bytes."""

    exchange: bytes
    routing_key: bytes
    properties: bytes
    body: bytes | bytearray  # a large one as assembled from its frames, never copied
    destinations: tuple[Destination, ...]
    born_ts_ms: int = 0
    flags: int = 0


_flags_of = itemgetter(6)  # Record.flags


def any_persistent(records: Iterable[Record]) -> bool:
    """Whether one of ``records`` is persistent: their distinct flags gathered in one C loop
    (a generator's step per record cost more), then looked at."""
    return any(flags & PERSISTENT for flags in set(map(_flags_of, records)))


class StoredMessage(NamedTuple):
    """A message read back; ``properties`` and ``body`` are slices of one read buffer."""

    queue_offset: int
    commit_offset: int
    exchange: bytes
    routing_key: bytes
    properties: memoryview
    body: memoryview
    born_ts_ms: int
    store_ts_ms: int
    flags: int


class DispatchRun(NamedTuple):
    """Consume-queue entries (packed) for consecutive records that share destinations;
    ``closes`` when one of them is flagged CLOSES (found while encoding: no second scan)."""

    destinations: tuple[Destination, ...]
    entries: bytearray
    closes: bool = False


class EncodedChunk(NamedTuple):
    """Records encoded for one segment: bytes to write at ``start`` and how many records."""

    start: int
    data: bytearray
    record_count: int


def record_size(record: Record) -> int:
    return (
        HEADER_SIZE
        + DEST_SIZE * len(record.destinations)
        + len(record.exchange)
        + len(record.routing_key)
        + len(record.properties)
        + len(record.body)
    )


def encode_blank(
    physical_offset: int, size: int, last_store_ts_ms: int, magic: int = BLANK_MAGIC
) -> bytes:
    """A filler (or hole) of logical ``size`` bytes; only its 28-byte header is written."""
    tail = struct.pack("<QQ", physical_offset, last_store_ts_ms)
    return BLANK.pack(size, magic, zlib.crc32(tail), physical_offset, last_store_ts_ms)


class RecordCheck(NamedTuple):
    """What a scan found at one position: ``size`` > 0 for a good record, filler or hole."""

    size: int
    is_blank: bool
    store_ts_ms: int
    problem: str
    is_hole: bool = False


def check_record(buf: bytes | memoryview, pos: int, physical_offset: int) -> RecordCheck:
    """Validate the record starting at ``buf[pos]`` (which must hold all of it if it claims to)."""
    avail = len(buf) - pos
    if avail < 12:
        return RecordCheck(0, False, 0, "truncated header")
    size, magic, crc = HEAD.unpack_from(buf, pos)
    if magic in (BLANK_MAGIC, HOLE_MAGIC):
        if avail < BLANK_SIZE:
            return RecordCheck(0, True, 0, "truncated filler")
        _, _, _, phys, last_ts = BLANK.unpack_from(buf, pos)
        if zlib.crc32(bytes(buf[pos + 12 : pos + BLANK_SIZE])) != crc or phys != physical_offset:
            return RecordCheck(0, True, 0, "bad filler checksum")
        if magic == HOLE_MAGIC:
            return RecordCheck(size, False, last_ts, "", is_hole=True)
        return RecordCheck(size, True, last_ts, "")
    if magic not in (MESSAGE_MAGIC, COPY_MAGIC):
        if size == 0 and magic == 0:
            return RecordCheck(0, False, 0, "end of data")
        return RecordCheck(0, False, 0, f"bad magic {magic:#x}")
    if size < HEADER_SIZE:
        return RecordCheck(0, False, 0, f"bad size {size}")
    if avail < size:
        return RecordCheck(0, False, 0, f"truncated record: {avail} of {size} bytes")
    fields = HEADER.unpack_from(buf, pos)
    if fields[3] != physical_offset:
        return RecordCheck(0, False, 0, f"record claims offset {fields[3]}")
    body_end = HEADER_SIZE + DEST_SIZE * fields[7] + fields[8] + fields[9] + fields[10] + fields[11]
    if body_end != size:
        return RecordCheck(0, False, 0, "field lengths disagree with the record size")
    if zlib.crc32(buf[pos + 12 : pos + size]) != crc:
        return RecordCheck(0, False, 0, "crc mismatch")
    return RecordCheck(size, False, fields[5], "")


def decode_destinations(buf: bytes | memoryview, pos: int) -> tuple[Destination, ...]:
    count = HEADER.unpack_from(buf, pos)[7]
    base = pos + HEADER_SIZE
    return tuple(
        (q, p) for q, p, _ in (DEST.unpack_from(buf, base + i * DEST_SIZE) for i in range(count))
    )


def relocated_copy(raw: bytes | bytearray | memoryview, new_offset: int) -> bytearray:
    """The record ``raw`` (whole, valid) as a copy at ``new_offset``: same content, new offset
    and magic, checksum recomputed."""
    copy = bytearray(raw)
    struct.pack_into("<I", copy, 4, COPY_MAGIC)
    struct.pack_into("<Q", copy, 12, new_offset)
    struct.pack_into("<I", copy, 8, zlib.crc32(memoryview(copy)[12:]))
    return copy
