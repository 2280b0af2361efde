"""Encoding a batch of records into a commitlog chunk, and its consume-queue entries.

The hot path of every append: the pure reference here, its compiled twin in
speedups/mqgw_speedups/record_encode.pyx (storage/twins.py picks; the two are held equal by
tests/storage/test_record_twins.py). Destination bytes are cached per destination tuple, and
consume-queue entries are grouped into runs of equal destinations so that fan-out to N queues
costs N buffer extends per run, not per message.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from storage.errors import RecordTooLarge
from storage.record import (
    BLANK_SIZE,
    CLOSES,
    CQ_ENTRY,
    DEST,
    HEAD,
    HEADER_SIZE,
    MESSAGE_MAGIC,
    TAIL,
    Destination,
    DispatchRun,
    EncodedChunk,
    Record,
)

# Below this body size a record's parts are joined for one CRC call (the fast path for small
# messages); above it they are checksummed and copied part by part.
_JOIN_BELOW_BYTES = 64 << 10


class DestinationCache:
    """Packed destination lists, reused across batches (most traffic repeats a few)."""

    def __init__(self, limit: int = 4096) -> None:
        self._packed: dict[tuple[Destination, ...], bytes] = {}
        self._limit = limit

    def get(self, destinations: tuple[Destination, ...]) -> bytes:
        packed = self._packed.get(destinations)
        if packed is None:
            packed = b"".join(DEST.pack(q, p, 0) for q, p in destinations)
            if len(self._packed) >= self._limit:
                self._packed.clear()
            self._packed[destinations] = packed
        return packed


def encode_chunk(
    records: Sequence[Record],
    first: int,
    start_offset: int,
    space_bytes: int,
    store_ts_ms: int,
    max_record_bytes: int,
    dest_cache: DestinationCache,
    runs: list[DispatchRun],
    offsets: list[int] | None = None,
) -> EncodedChunk:
    """Encode records[first:] while they fit in ``space_bytes`` (leaving room for a filler).

    Consume-queue entries go into ``runs``. Raises RecordTooLarge before anything is written.
    """
    buf = bytearray()
    offset = start_offset
    limit = space_bytes - BLANK_SIZE
    crc32 = zlib.crc32
    tail_pack = TAIL.pack
    head_pack = HEAD.pack
    entry_pack = CQ_ENTRY.pack
    closes = CLOSES
    run = runs[-1] if runs else None
    prev_dests: tuple[Destination, ...] | None = None
    dest_bytes = b""
    dest_count = 0
    for index in range(first, len(records)):
        exchange, routing_key, properties, body, dests, born, flags = records[index]
        if dests is not prev_dests:  # batches usually repeat one destination list
            dest_bytes = dest_cache.get(dests)
            dest_count = len(dests)
            prev_dests = dests
        size = (
            HEADER_SIZE
            + len(dest_bytes)
            + len(exchange)
            + len(routing_key)
            + len(properties)
            + len(body)
        )
        if size > max_record_bytes:
            raise RecordTooLarge(size, max_record_bytes)
        if len(buf) + size > limit:
            return EncodedChunk(start_offset, buf, index - first)
        tail = tail_pack(
            offset,
            born,
            store_ts_ms,
            flags,
            dest_count,
            len(exchange),
            len(routing_key),
            len(properties),
            len(body),
        )
        if len(body) < _JOIN_BELOW_BYTES:
            payload = b"".join((tail, dest_bytes, exchange, routing_key, properties, body))
            buf += head_pack(size, MESSAGE_MAGIC, crc32(payload))
            buf += payload
        else:  # a call per large record only: small ones stay inline above
            _add_large(buf, size, (tail, dest_bytes, exchange, routing_key, properties, body))
        if dests:
            if (
                run is None
                or (run.destinations is not dests and run.destinations != dests)
                or (flags & closes and not run.closes)
            ):
                run = DispatchRun(dests, bytearray(), bool(flags & closes))
                runs.append(run)
            run.entries.extend(entry_pack(offset, size, store_ts_ms))
        if offsets is not None:
            offsets.append(offset)
        offset += size
    return EncodedChunk(start_offset, buf, len(records) - first)


def _add_large(buf: bytearray, size: int, parts: tuple[bytes | bytearray, ...]) -> None:
    """Add a record with a large body to ``buf``, checksummed and copied part by part.

    A large body is copied once, into the chunk: joining it into a payload first would hold
    it three times at once (a 512 MiB message: 1.5 GiB).
    """
    crc = zlib.crc32(parts[0])
    for part in parts[1:]:
        crc = zlib.crc32(part, crc)
    buf += HEAD.pack(size, MESSAGE_MAGIC, crc)
    for part in parts:
        buf += part
