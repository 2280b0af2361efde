"""ConsumeQueue: the per-(queue, partition) index of fixed 20-byte entries into the commitlog.

Entry n (the message at logical offset n) lives at byte n*20 of the queue's segment files:
commitlog offset u64, record size u32, timestamp u64 (store time; later a TTL deadline).
Counting, purging and expiry are offset arithmetic on these files; they never read message
bodies. Writes go to the page cache and are fsynced by the store checkpoint; anything lost is
rebuilt from the commitlog on recovery, because each record names its destinations.

Write-behind: an append's entries may stay in memory (``unwritten``, the index's tail) until
about 4 KiB gather, a checkpoint writes them, or something other than reading needs the files:
with thousands of queues each taking a message per publish batch, one write per queue per
batch was the store's largest cost. Reads see the tail; the checkpoint covers only what it
wrote, and recovery re-dispatches the rest from the commitlog as it would after any crash.

The garbage collector may re-point an entry at a copy of its record further ahead (the size's
RELOCATED_ENTRY bit says so). Entries from the original dispatch stay in commit order, and a
relocated entry always points past every original entry before it, so "the lowest commit
offset from here on" is found by reading up to the first original entry, not the whole queue.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from storage.log.file_system import FileSystem
from storage.log.segment_files import Segment, SegmentFiles
from storage.record import CQ_ENTRY, CQ_ENTRY_SIZE, RELOCATED_ENTRY

_SCAN_ENTRIES = 1024  # entries read per pread while scanning
WRITE_BEHIND_BYTES = 4096  # a deferred tail this long is written at the next append


class ConsumeQueue:
    def __init__(
        self,
        fs: FileSystem,
        directory: Path,
        queue_id: int,
        partition: int,
        entries_per_segment: int,
    ) -> None:
        self.queue_id = queue_id
        self.partition = partition
        self.files = SegmentFiles(fs, directory, entries_per_segment * CQ_ENTRY_SIZE)
        self.min_offset = 0  # first logical offset whose message still exists
        self.max_offset = 0  # next logical offset to be written
        self.last_commit_offset = -1  # commitlog offset of the last entry (idempotent reput)
        self.dirty: dict[int, Segment] = {}  # segments written since the last checkpoint
        self.unwritten = bytearray()  # the last entries, not yet in the files (write-behind)
        # lowest_commit's last answer (start, lowest), forgotten when entries change.
        self._lowest_memo: tuple[int, int | None] | None = None

    def load(self) -> None:
        self.files.load()
        last = self.files.last
        if last is None:
            return
        # A torn entry (partial write) at the tail is cut back to a whole entry.
        torn = last.written % CQ_ENTRY_SIZE
        if torn:
            self.files.truncate(last, last.written - torn)
        self.min_offset = self.files.min_offset // CQ_ENTRY_SIZE
        self.max_offset = last.end // CQ_ENTRY_SIZE
        self.refresh_last_commit()

    def refresh_last_commit(self) -> None:
        self.last_commit_offset = self._last_original_commit()

    def _last_original_commit(self) -> int:
        """The newest dispatched record's offset (recovery re-dispatches after it); relocated
        entries point at copies, which are never dispatched, so they do not count."""
        for logical in range(self.max_offset - 1, self.min_offset - 1, -1):
            commit, size, _ = self.entry(logical)
            if not size & RELOCATED_ENTRY:
                return commit
        return -1

    def prepare(self) -> None:
        """Create the first index file of an empty queue (append would, on first use)."""
        if self.files.last is None:
            pos = self.max_offset * CQ_ENTRY_SIZE
            self.files.create(pos - pos % self.files.segment_size)

    def set_start(self, logical_offset: int) -> None:
        """For a new queue whose entries begin after offset 0 (never needed on a fresh one)."""
        self.min_offset = self.max_offset = logical_offset

    def append(
        self, entries: bytes | bytearray, last_commit_offset: int, defer: bool = False
    ) -> None:
        """Append packed entries (a multiple of 20 bytes) at max_offset; ``defer``: they may
        stay in memory for now (see the module's note on write-behind)."""
        unwritten = self.unwritten
        if defer and len(unwritten) + len(entries) < WRITE_BEHIND_BYTES:
            unwritten += entries
            self.max_offset += len(entries) // CQ_ENTRY_SIZE
            self.last_commit_offset = last_commit_offset
            return
        if unwritten:
            self._write_at(self.max_offset * CQ_ENTRY_SIZE - len(unwritten), unwritten + entries)
            self.unwritten = bytearray()
        else:
            self._write_at(self.max_offset * CQ_ENTRY_SIZE, entries)
        self.last_commit_offset = last_commit_offset

    def write_behind(self) -> None:
        """Write the entries held in memory to the files (OSError: they stay held)."""
        held = self.unwritten
        if held:
            self._write_at(self.max_offset * CQ_ENTRY_SIZE - len(held), bytes(held))
            self.unwritten = bytearray()

    def roll_back(self, max_offset: int, last_commit_offset: int) -> None:
        """Forget the entries from ``max_offset`` on (an append that failed), held or written."""
        held_from = self.max_offset - len(self.unwritten) // CQ_ENTRY_SIZE
        if max_offset >= held_from:
            del self.unwritten[(max_offset - held_from) * CQ_ENTRY_SIZE :]
        else:
            self.unwritten = bytearray()
        self.files.truncate_from(max_offset * CQ_ENTRY_SIZE)
        self.max_offset, self.last_commit_offset = max_offset, last_commit_offset

    def _write_at(self, pos: int, entries: bytes | bytearray) -> None:
        view = memoryview(entries)
        while view:
            segment = self.files.last
            if segment is None or segment.end >= segment.start + self.files.segment_size:
                segment = self.files.create(pos - pos % self.files.segment_size)
            room = segment.start + self.files.segment_size - pos
            part = view[:room]
            self.files.write(segment, part, pos - segment.start)
            self.dirty[segment.start] = segment
            pos += len(part)
            view = view[len(part) :]
        self.max_offset = pos // CQ_ENTRY_SIZE

    def entry(self, logical_offset: int) -> tuple[int, int, int]:
        data = self.read_entries(logical_offset, 1)
        commit_offset, size, ts = CQ_ENTRY.unpack(data)
        return commit_offset, size, ts

    def read_entries(self, logical_offset: int, count: int) -> bytes:
        pos, length = logical_offset * CQ_ENTRY_SIZE, count * CQ_ENTRY_SIZE
        held = self.unwritten
        held_from = self.max_offset * CQ_ENTRY_SIZE - len(held)
        if not held or pos + length <= held_from:
            return self.files.read(pos, length)
        if pos >= held_from:
            return bytes(held[pos - held_from : pos - held_from + length])
        return self.files.read(pos, held_from - pos) + bytes(held[: pos + length - held_from])

    def truncate_to_commit_offset(self, commit_end: int) -> int:
        """Drop entries that point at or beyond ``commit_end``; returns how many went."""
        self.write_behind()
        dropped = 0
        while (
            self.max_offset > self.min_offset and self.entry(self.max_offset - 1)[0] >= commit_end
        ):
            self.max_offset -= 1
            dropped += 1
        if dropped:
            self._lowest_memo = None
            self.files.truncate_from(self.max_offset * CQ_ENTRY_SIZE)
            self.last_commit_offset = self._last_original_commit()
        return dropped

    def drop_before_commit_offset(self, commit_min: int) -> None:
        """Forget entries pointing below ``commit_min`` (retention deleted their records)."""
        self.write_behind()
        self._lowest_memo = None
        per_segment = self.files.segment_size // CQ_ENTRY_SIZE
        while len(self.files.segments) > 1:
            first = self.files.segments[0]
            last_in_first = (first.start + first.written) // CQ_ENTRY_SIZE - 1
            if self._ordered_commit(last_in_first) >= commit_min:
                break
            self.files.remove_first()
        lo = max(self.min_offset, self.files.min_offset // CQ_ENTRY_SIZE)
        hi = min(self.max_offset, lo + per_segment)
        # Binary search the first entry still pointing into the commitlog.
        while lo < hi:
            mid = (lo + hi) // 2
            if self._ordered_commit(mid) < commit_min:
                lo = mid + 1
            else:
                hi = mid
        self.min_offset = max(self.min_offset, lo)

    def _ordered_commit(self, logical: int) -> int:
        """A key in commit order for the binary searches: an original entry's own offset; for
        a relocated one, that of the next original entry (an older message goes with it)."""
        for commit, size in self._scan(logical):
            if not size & RELOCATED_ENTRY:
                return commit
        return self.entry(logical)[0]

    def _scan(self, start: int) -> Iterator[tuple[int, int]]:
        """(commit offset, raw size) of the entries from ``start`` to the end, read in chunks."""
        for _logical, commit, size, _ts in self.entries_from(start):
            yield commit, size

    def entries_from(self, start: int) -> Iterator[tuple[int, int, int, int]]:
        """(logical offset, commit offset, raw size, timestamp) from ``start`` on."""
        pos = max(start, self.min_offset)
        while pos < self.max_offset:
            count = min(_SCAN_ENTRIES, self.max_offset - pos)
            for i, (commit, size, ts) in enumerate(
                CQ_ENTRY.iter_unpack(self.read_entries(pos, count))
            ):
                yield pos + i, commit, size, ts
            pos += count

    def lowest_commit(self, start: int) -> int | None:
        """The lowest commit offset any entry from ``start`` on points at (None: no entries):
        relocated entries up to the first original one, then that one. Remembered until
        entries are re-pointed or cut (an append cannot lower it: new records lie past every
        copy already made), as a long run of relocated entries is costly to read each time."""
        memo = self._lowest_memo
        if memo is not None and memo[0] == start:
            return memo[1]
        lowest: int | None = None
        for commit, size in self._scan(start):
            lowest = commit if lowest is None else min(lowest, commit)
            if not size & RELOCATED_ENTRY:
                break
        self._lowest_memo = (start, lowest) if lowest is not None else None
        return lowest

    def drop_consumed_before(self, read_start: int) -> None:
        """Remove index files whose entries all lie below ``read_start`` (every group has
        consumed them; their records may be gone)."""
        self.write_behind()
        while len(self.files.segments) > 1:
            first = self.files.segments[0]
            if (first.start + first.written) // CQ_ENTRY_SIZE > read_start:
                break
            self.files.remove_first()
        self.min_offset = max(self.min_offset, self.files.min_offset // CQ_ENTRY_SIZE)

    def repoint(self, logical: int, commit: int, size: int, ts: int) -> Segment:
        """Point entry ``logical`` at a copy of its record; returns the file written."""
        self.write_behind()
        pos = logical * CQ_ENTRY_SIZE
        segment = self.files.find(pos)
        if segment is None or pos + CQ_ENTRY_SIZE > segment.end:
            raise ValueError(f"entry {logical} is not in queue {self.queue_id}'s files")
        self.files.write(
            segment, CQ_ENTRY.pack(commit, size | RELOCATED_ENTRY, ts), pos - segment.start
        )
        self._lowest_memo = None
        self.dirty[segment.start] = segment
        return segment

    def offset_for_time(self, ts_ms: int) -> int:
        """First logical offset whose timestamp is >= ts_ms (max_offset if none)."""
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            if self.entry(mid)[2] < ts_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def take_dirty(self) -> list[Segment]:
        """Segments to fsync for a checkpoint (the set is cleared); call write_behind first."""
        dirty = [segment for segment in self.dirty.values() if segment.fd >= 0]
        self.dirty.clear()
        return dirty

    def close(self) -> None:
        self.unwritten = bytearray()
        self.files.close()

    def delete(self) -> None:
        self.unwritten = bytearray()
        self.files.delete_all()
