"""The commitlog as replication moves it: raw record bytes read on the master and written on a
slave at the same offsets, so the two logs are byte for byte the same and so is every
consume-queue offset derived from them (the slave runs the same dispatch).

A chunk never crosses a segment boundary: it is a run of whole records from one segment,
possibly closed by the segment's filler, whose logical end is then the segment's end (a filler
is 28 bytes on disk but spans the rest of the segment).
"""

from __future__ import annotations

from typing import NamedTuple

from storage.errors import CorruptionError
from storage.log.log_store import LogStore
from storage.log.recovery import _redispatch
from storage.log.segment_files import segment_name
from storage.record import BLANK_MAGIC, BLANK_SIZE, HEAD


class Chunk(NamedTuple):
    start: int  # commitlog offset of the first byte
    data: bytes  # whole records (a filler only last)
    end: int  # logical end: start + len(data), or the segment's end after a filler


def read_chunk(store: LogStore, start: int, max_bytes: int) -> Chunk:
    """Records from ``start`` (a record boundary below the write offset, or the write offset
    itself: then an empty chunk), at most ``max_bytes`` unless the first record is larger."""
    log = store.commit_log
    size = log.segment_size
    end_limit = log.write_offset
    if start >= end_limit:
        return Chunk(start, b"", start)
    segment = log.files.find(start)
    if segment is None:
        raise CorruptionError(segment_name(start - start % size), start, "no segment holds it")
    readable = min(segment.written - (start - segment.start), end_limit - start)
    buf = log.read(start, min(readable, max(max_bytes, BLANK_SIZE)))
    pos = 0
    while pos + 12 <= len(buf):
        record_size, magic, _ = HEAD.unpack_from(buf, pos)
        if magic == BLANK_MAGIC:
            whole = buf[: pos + BLANK_SIZE]
            return Chunk(start, whole, segment.start + size)
        if pos + record_size > len(buf):
            if pos == 0 and record_size <= readable:  # one record larger than max_bytes
                return Chunk(start, log.read(start, record_size), start + record_size)
            break
        pos += record_size
    return Chunk(start, buf[:pos], start + pos)


def write_chunk(store: LogStore, chunk: Chunk) -> int:
    """Write a chunk read from the master at the same offset and index it; returns the number
    of index entries added. The chunk must start at this log's write offset."""
    log = store.commit_log
    if chunk.start != log.write_offset:
        raise ValueError(f"chunk at {chunk.start}, log ends at {log.write_offset}")
    if not chunk.data:
        return 0
    is_filler = chunk.end != chunk.start + len(chunk.data)
    log._write([(chunk.start, chunk.data, is_filler)], log.last_store_ts_ms)
    found = log.scan(chunk.start, None)
    if found.offset != chunk.end:
        log.truncate_from(chunk.start)
        raise CorruptionError(
            segment_name(chunk.start - chunk.start % log.segment_size),
            found.offset,
            f"replicated chunk does not check out: {found.problem or 'short'}",
        )
    log.write_offset = chunk.end
    if is_filler:
        log.files.create(chunk.end)  # the next chunk starts the next segment
    return _redispatch(store, chunk.start)


def truncate_log(store: LogStore, offset: int) -> int:
    """Cut the log (and every index entry pointing at or past ``offset``) back to ``offset``,
    durably: the checkpoint is rewritten so a restart does not look past it. Returns the bytes
    cut."""
    log = store.commit_log
    cut = log.write_offset - offset
    if cut <= 0:
        return 0
    log.truncate_from(offset)
    for cq in store.cqs.values():
        cq.truncate_to_commit_offset(offset)
    store.durable_offset = min(store.durable_offset, offset)
    store.checkpointed_offset = min(store.checkpointed_offset, offset)
    store.flush()
    store.checkpoint()
    return cut
