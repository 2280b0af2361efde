"""Decoding a run of commitlog records, read with one pread, into StoredMessages; and taking
records that another queue's read decoded lately (a fan-out's) as they were kept.

The hot path of every message read back from the store (a queue behind its publishers, a
restart, a consumer that came late): the pure reference here, its compiled twin in
speedups/mqgw_speedups/record_decode.pyx (storage/twins.py picks; the two are held equal by
tests/storage/test_record_decode_twins.py). Reading._fetch (storage/log/reading.py) sizes the
runs and raises what this returns as a CorruptionError; storage/log/recent_records.py keeps
what ``keep`` is given.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, MutableMapping, Sequence

from storage.record import (
    COPY_MAGIC,
    DEST_SIZE,
    ENTRY_SIZE_MASK,
    HEADER,
    HEADER_SIZE,
    HOLE_MAGIC,
    MESSAGE_MAGIC,
    StoredMessage,
)

PAST_THE_END = "record runs past the end of the commitlog"
NOT_THE_RECORD = "consume queue entry does not match the record"
CRC_MISMATCH = "crc mismatch"

# A record as decode_run keeps it for take_kept: its size, then a StoredMessage's fields
# from the exchange on (properties and body as views of the first read's buffer).
KeptRecord = tuple[int, bytes, bytes, memoryview, memoryview, int, int, int]

# tuple.__new__ skips the NamedTuple's Python-level __new__ (a frame per message saved).
_make_tuple = tuple.__new__


def decode_run(
    buf: memoryview,
    entries: Sequence[tuple[int, int, int]],
    start: int,
    end: int,
    base: int,
    first_offset: int,
    verify: bool,
    messages: list[StoredMessage],
    keep: MutableMapping[int, KeptRecord] | None = None,
) -> tuple[int, str] | None:
    """Append the messages of ``entries[start:end]`` (consume-queue entries: commit offset,
    size, timestamp) to ``messages``; ``buf`` holds the commitlog from offset ``base``, and
    entry ``k`` is the partition's offset ``first_offset + k``. A hole left by a repair is
    skipped. None, or the commit offset of the first record that is not what its entry says,
    and why (the messages before it are appended). A record with more than one destination
    goes into ``keep`` too, by commit offset: other queues read it next (take_kept)."""
    limit = len(buf)
    append = messages.append
    make = _make_tuple
    unpack_from = HEADER.unpack_from
    crc32 = zlib.crc32
    for k in range(start, end):
        commit, size, _ = entries[k]
        size &= ENTRY_SIZE_MASK
        pos = commit - base
        if pos + size > limit:
            return commit, PAST_THE_END
        (
            total,
            magic,
            crc,
            physical,
            born,
            stored,
            flags,
            dests,
            ex_len,
            key_len,
            p_len,
            b_len,
        ) = unpack_from(buf, pos)
        if magic != MESSAGE_MAGIC or total != size or physical != commit:
            if magic == COPY_MAGIC and total == size and physical == commit:
                pass  # relocated by the garbage collector
            elif magic == HOLE_MAGIC:
                continue  # removed by repair; `storage check` listed it
            else:
                return commit, NOT_THE_RECORD
        if verify and crc32(buf[pos + 12 : pos + size]) != crc:
            return commit, CRC_MISMATCH
        p = pos + HEADER_SIZE + dests * DEST_SIZE
        q = p + ex_len
        r = q + key_len
        t = r + p_len
        fields = (
            first_offset + k,
            commit,
            bytes(buf[p:q]),
            bytes(buf[q:r]),
            buf[r:t],
            buf[t : t + b_len],
            born,
            stored,
            flags,
        )
        append(make(StoredMessage, fields))
        if keep is not None and dests > 1:
            keep[commit] = (size, *fields[2:])
    return None


def take_kept(
    entries: Sequence[tuple[int, int, int]],
    start: int,
    end: int,
    first_offset: int,
    floor: int,
    young: Mapping[int, KeptRecord],
    old: Mapping[int, KeptRecord],
    messages: list[StoredMessage],
) -> int:
    """Append the messages of ``entries[start:end]`` that decode_run kept (``young``, else
    ``old``), as it would decode them, from ``start`` on while each is kept, of its entry's
    size, and at or past ``floor`` (the commitlog's first offset); the index of the first
    that is not, for the caller to read."""
    append = messages.append
    make = _make_tuple
    for k in range(start, end):
        commit, size, _ = entries[k]
        kept = young.get(commit)
        if kept is None:
            kept = old.get(commit)
        if kept is None or kept[0] != size & ENTRY_SIZE_MASK or commit < floor:
            return k
        append(make(StoredMessage, (first_offset + k, commit, *kept[1:])))
    return end
