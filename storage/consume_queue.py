"""ConsumeQueue: the per-(queue, partition) index of fixed 20-byte entries into the commitlog.

Entry n (the message at logical offset n) lives at byte n*20 of the queue's segment files:
commitlog offset u64, record size u32, timestamp u64 (store time; later a TTL deadline).
Counting, purging and expiry are offset arithmetic on these files; they never read message
bodies. Writes go to the page cache and are fsynced by the store checkpoint; anything lost is
rebuilt from the commitlog on recovery, because each record names its destinations.
"""

from __future__ import annotations

from pathlib import Path

from storage.file_system import FileSystem
from storage.record import CQ_ENTRY, CQ_ENTRY_SIZE
from storage.segment_files import Segment, SegmentFiles


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
        if self.max_offset > self.min_offset:
            self.last_commit_offset = self.entry(self.max_offset - 1)[0]

    def prepare(self) -> None:
        """Create the first index file of an empty queue (append would, on first use)."""
        if self.files.last is None:
            pos = self.max_offset * CQ_ENTRY_SIZE
            self.files.create(pos - pos % self.files.segment_size)

    def set_start(self, logical_offset: int) -> None:
        """For a new queue whose entries begin after offset 0 (never needed on a fresh one)."""
        self.min_offset = self.max_offset = logical_offset

    def append(self, entries: bytes | bytearray, last_commit_offset: int) -> None:
        """Append packed entries (a multiple of 20 bytes) at max_offset."""
        pos = self.max_offset * CQ_ENTRY_SIZE
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
        self.last_commit_offset = last_commit_offset

    def entry(self, logical_offset: int) -> tuple[int, int, int]:
        data = self.files.read(logical_offset * CQ_ENTRY_SIZE, CQ_ENTRY_SIZE)
        commit_offset, size, ts = CQ_ENTRY.unpack(data)
        return commit_offset, size, ts

    def read_entries(self, logical_offset: int, count: int) -> bytes:
        return self.files.read(logical_offset * CQ_ENTRY_SIZE, count * CQ_ENTRY_SIZE)

    def truncate_to_commit_offset(self, commit_end: int) -> int:
        """Drop entries that point at or beyond ``commit_end``; returns how many went."""
        dropped = 0
        while (
            self.max_offset > self.min_offset and self.entry(self.max_offset - 1)[0] >= commit_end
        ):
            self.max_offset -= 1
            dropped += 1
        if dropped:
            self.files.truncate_from(self.max_offset * CQ_ENTRY_SIZE)
            self.last_commit_offset = (
                self.entry(self.max_offset - 1)[0] if self.max_offset > self.min_offset else -1
            )
        return dropped

    def drop_before_commit_offset(self, commit_min: int) -> None:
        """Forget entries pointing below ``commit_min`` (retention deleted their records)."""
        per_segment = self.files.segment_size // CQ_ENTRY_SIZE
        while len(self.files.segments) > 1:
            first = self.files.segments[0]
            last_in_first = (first.start + first.written) // CQ_ENTRY_SIZE - 1
            if self.entry(last_in_first)[0] >= commit_min:
                break
            self.files.remove_first()
        lo = max(self.min_offset, self.files.min_offset // CQ_ENTRY_SIZE)
        hi = min(self.max_offset, lo + per_segment)
        # Binary search the first entry still pointing into the commitlog.
        while lo < hi:
            mid = (lo + hi) // 2
            if self.entry(mid)[0] < commit_min:
                lo = mid + 1
            else:
                hi = mid
        self.min_offset = max(self.min_offset, lo)

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
        """Segments to fsync for a checkpoint (the set is cleared)."""
        dirty = [segment for segment in self.dirty.values() if segment.fd >= 0]
        self.dirty.clear()
        return dirty

    def close(self) -> None:
        self.files.close()

    def delete(self) -> None:
        self.files.delete_all()
