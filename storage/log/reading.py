"""The log store's read path: a partition's messages from an offset, fetched in runs.

A mixin of LogStore. ``read`` clamps the offset to the partition's readable range and sizes
the batch; ``_fetch`` reads the records behind the index entries with one pread per run of
nearby records (a large record once for every queue holding it, through SharedReads), and
has each run checked and decoded into StoredMessages in one call (storage/record_decode.py,
and its compiled twin). A fan-out's records, decoded by the first queue to read them, are
kept for the others (storage/log/recent_records.py): they take them without a read, a CRC
check or a decode.
"""

from __future__ import annotations

from storage import record_decode, twins
from storage.errors import CorruptionError
from storage.log.segment_files import segment_name
from storage.log.shared_reads import SHARE_FROM_BYTES, SharedRecord
from storage.log.store_state import StoreState
from storage.record import CQ_ENTRY, ENTRY_SIZE_MASK, StoredMessage
from storage.results import ReadResult, ReadStatus

decode_run = twins.pick(record_decode.decode_run)
take_kept = twins.pick(record_decode.take_kept)
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
        """Read the records behind ``entries`` with one pread per run of nearby records,
        decoded a run per call (storage/record_decode.py, compiled where built)."""
        messages: list[StoredMessage] = []
        append = messages.append
        make = tuple.__new__  # skips the NamedTuple's Python-level __new__ frame
        verify = self.config.verify_crc_on_read
        segment_size = self.config.segment_size_bytes
        min_commit = self.commit_log.min_offset
        shared = self.shared_reads
        recent = self.commit_log.recent
        keeping = recent.keeping
        i, n = 0, len(entries)
        while i < n:
            if recent.young or recent.old:  # a fan-out's, read by another queue lately?
                young, old = recent.young, recent.old
                taken = take_kept(entries, i, n, first_offset, min_commit, young, old, messages)
                if taken > i:
                    i = taken
                    continue
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
            keep = recent.young if keeping and not large else None
            had = len(keep) if keep is not None else 0
            bad = decode_run(buf, entries, i, j, base, first_offset, verify, messages, keep)
            if keep is not None and len(keep) != had:
                recent.kept(end - base)
            if bad is not None:
                raise self._corrupt(*bad)
            if large and messages and messages[-1].commit_offset == base:
                shared.put(base, SharedRecord(*messages[-1][2:]))
            i = j
        return messages

    def _corrupt(self, commit: int, reason: str) -> CorruptionError:
        segment_start = commit - commit % self.config.segment_size_bytes
        return CorruptionError(segment_name(segment_start), commit, reason)
