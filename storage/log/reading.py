"""The log store's read path: a partition's messages from an offset, fetched in runs.

A mixin of LogStore. ``read`` clamps the offset to the partition's readable range and sizes
the batch; ``_fetch`` reads the records behind the index entries with one pread per run of
nearby records (a large record once for every queue holding it, through SharedReads), checks
them and decodes them into StoredMessages inline (a call per message would cost more than
the decoding itself).
"""

from __future__ import annotations

import zlib

from storage.errors import CorruptionError
from storage.log.segment_files import segment_name
from storage.log.shared_reads import SHARE_FROM_BYTES, SharedRecord
from storage.log.store_state import StoreState
from storage.record import (
    COPY_MAGIC,
    CQ_ENTRY,
    DEST_SIZE,
    ENTRY_SIZE_MASK,
    HEADER,
    HEADER_SIZE,
    HOLE_MAGIC,
    MESSAGE_MAGIC,
    StoredMessage,
)
from storage.results import ReadResult, ReadStatus

_READ_GAP_BYTES = 64 << 10  # records this close together are fetched with one pread


class Reading(StoreState):
    """The read path of LogStore."""

    def read(
        self,
        queue_id: int,
        partition: int,
        offset: int,
        max_count: int = 256,
        max_bytes: int = 4 << 20,
    ) -> ReadResult:
        """Messages from ``offset``; see ReadStatus for offsets outside [min, max]."""
        self._check_open()
        cq = self._cq(queue_id, partition)
        low, high = self.partition_range(queue_id, partition)
        status = ReadStatus.FOUND
        if offset < low:
            offset, status = low, ReadStatus.MOVED
        elif offset > high:
            return ReadResult(ReadStatus.OFFSET_OVERFLOW, [], high, low, high)
        if offset >= high:
            empty = ReadStatus.NO_NEW_MESSAGE if status is ReadStatus.FOUND else status
            return ReadResult(empty, [], offset, low, high)
        entries = list(CQ_ENTRY.iter_unpack(cq.read_entries(offset, min(max_count, high - offset))))
        total = 0
        count = 0
        for _, raw_size, _ in entries:
            size = raw_size & ENTRY_SIZE_MASK
            if count and total + size > max_bytes:
                break
            total += size
            count += 1
        messages = self._fetch(entries[:count], offset)
        return ReadResult(status, messages, offset + count, low, high)

    def _fetch(self, entries: list[tuple[int, int, int]], first_offset: int) -> list[StoredMessage]:
        """Read the records behind ``entries`` with one pread per run of nearby records.

        Decoding is inlined in this loop on purpose: a call per message costs more than the
        decoding itself (see the store benchmark's catch-up figure).
        """
        messages: list[StoredMessage] = []
        append = messages.append
        make = tuple.__new__  # skips the NamedTuple's Python-level __new__ frame
        unpack_from = HEADER.unpack_from
        crc32 = zlib.crc32
        verify = self.config.verify_crc_on_read
        segment_size = self.config.segment_size_bytes
        min_commit = self.commit_log.min_offset
        shared = self.shared_reads
        i, n = 0, len(entries)
        while i < n:
            base, size, _ = entries[i]
            end = base + (size & ENTRY_SIZE_MASK)
            # A large record is read on its own, and only once for all the queues holding it.
            large = end - base >= SHARE_FROM_BYTES
            j = i + 1
            while j < n and not large:
                commit, size, _ = entries[j]
                if commit < end or commit - end > _READ_GAP_BYTES:
                    break
                if commit // segment_size != base // segment_size:
                    break
                if size & ENTRY_SIZE_MASK >= SHARE_FROM_BYTES:
                    break
                end = commit + (size & ENTRY_SIZE_MASK)
                j += 1
            if base < min_commit:
                i = j
                continue
            if large and (hit := shared.get(base)) is not None:
                append(make(StoredMessage, (first_offset + i, base, *hit)))
                i = j
                continue
            buf = memoryview(self.commit_log.read(base, end - base))
            limit = len(buf)
            for k in range(i, j):
                commit, size, _ = entries[k]
                size &= ENTRY_SIZE_MASK
                pos = commit - base
                if pos + size > limit:
                    raise self._corrupt(commit, "record runs past the end of the commitlog")
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
                        raise self._corrupt(commit, "consume queue entry does not match the record")
                if verify and crc32(buf[pos + 12 : pos + size]) != crc:
                    raise self._corrupt(commit, "crc mismatch")
                p = pos + HEADER_SIZE + dests * DEST_SIZE
                q = p + ex_len
                r = q + key_len
                t = r + p_len
                append(
                    make(
                        StoredMessage,
                        (
                            first_offset + k,
                            commit,
                            bytes(buf[p:q]),
                            bytes(buf[q:r]),
                            buf[r:t],
                            buf[t : t + b_len],
                            born,
                            stored,
                            flags,
                        ),
                    )
                )
            if large and messages and messages[-1].commit_offset == base:
                shared.put(base, SharedRecord(*messages[-1][2:]))
            i = j
        return messages

    def _corrupt(self, commit: int, reason: str) -> CorruptionError:
        segment_start = commit - commit % self.config.segment_size_bytes
        return CorruptionError(segment_name(segment_start), commit, reason)
