"""Decoding a run of commitlog records, read with one pread, into StoredMessages.

The hot path of every message read back from the store (a queue behind its publishers, a
restart, a consumer that came late): the pure reference here, its compiled twin in
speedups/mqgw_speedups/record_decode.pyx (storage/twins.py picks; the two are held equal by
tests/storage/test_record_decode_twins.py). Reading._fetch (storage/log/reading.py) sizes the
runs and raises what this returns as a CorruptionError.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

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
) -> tuple[int, str] | None:
    """Append the messages of ``entries[start:end]`` (consume-queue entries: commit offset,
    size, timestamp) to ``messages``; ``buf`` holds the commitlog from offset ``base``, and
    entry ``k`` is the partition's offset ``first_offset + k``. A hole left by a repair is
    skipped. None, or the commit offset of the first record that is not what its entry says,
    and why (the messages before it are appended)."""
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
    return None
