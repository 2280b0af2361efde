"""CommitLog: every message once, in arrival order, in fixed-size segment files.

Appends are all-or-nothing per batch: the batch is encoded in full first (so an oversized
record is refused before a byte is written), then written with an undo list; any OSError
truncates the touched segments back and removes segments the batch created, so a failed
append leaves no half record behind, in memory or on disk.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from storage import record_encode, twins
from storage.errors import DiskFull, StoreWriteError
from storage.log.file_system import FileSystem
from storage.log.recent_records import RecentRecords
from storage.log.segment_files import Segment, SegmentFiles
from storage.record import (
    BLANK_SIZE,
    COPY_MAGIC,
    DEST_SIZE,
    HEADER,
    HEADER_SIZE,
    MESSAGE_MAGIC,
    DispatchRun,
    Record,
    check_record,
    encode_blank,
    relocated_copy,
)
from storage.record_encode import DestinationCache

# The batch encoder in use: its compiled twin when built (storage/twins.py).
encode_chunk = twins.pick(record_encode.encode_chunk)

_SCAN_CHUNK_BYTES = 4 << 20

# Called for each valid record during a scan: (commit offset, buffer, position, size).
RecordVisitor = Callable[[int, bytes, int, int], None]


@dataclass
class ScanEnd:
    """Where a scan stopped: ``offset`` is the end of valid data; ``problem`` why it stopped."""

    offset: int
    problem: str  # "" when the data simply ended


class CommitLog:
    def __init__(
        self, fs: FileSystem, directory: Path, segment_size: int, max_record_bytes: int
    ) -> None:
        if max_record_bytes > segment_size - 2 * BLANK_SIZE:
            raise ValueError("max_record_bytes must fit in one commitlog segment")
        self.files = SegmentFiles(fs, directory, segment_size)
        self.segment_size = segment_size
        self.max_record_bytes = max_record_bytes
        self.write_offset = 0
        self.last_store_ts_ms = 0
        self.sealed_ts_ms: dict[int, int] = {}  # segment start -> store ts of its last record
        self.dirty: dict[int, Segment] = {}
        self._dest_cache = DestinationCache()
        # A fan-out's records as a read decoded them (storage/log/reading.py); keyed by
        # commit offset, so a truncation, which lets an offset be written again, clears it.
        self.recent = RecentRecords()

    def load(self) -> None:
        self.files.load()
        for segment in self.files.segments:
            last_ts = self._filler_ts(segment)
            if last_ts is not None:
                self.sealed_ts_ms[segment.start] = last_ts

    def _filler_ts(self, segment: Segment) -> int | None:
        """The store timestamp in the filler that seals ``segment``; None if not sealed."""
        if segment.written < BLANK_SIZE:
            return None
        pos = segment.written - BLANK_SIZE
        data = self.files.fs.pread(segment.fd, BLANK_SIZE, pos)
        found = check_record(data, 0, segment.start + pos)
        if not found.is_blank or pos + found.size != self.segment_size:
            return None
        return found.store_ts_ms

    @property
    def logical_end(self) -> int:
        """End of the data on disk; a segment sealed by a filler reaches its boundary."""
        last = self.files.last
        if last is None:
            return self.write_offset
        if last.start in self.sealed_ts_ms:
            return last.start + self.segment_size
        return last.end

    def written_past(self, offset: int) -> int:
        """Bytes written at or past ``offset`` (what a flush that reached ``offset`` has yet to
        make durable). Offsets are logical: the skipped tail of a segment sealed early by a
        filler (up to a whole segment) costs nothing on disk, so it is not counted."""
        total = max(0, self.write_offset - offset)
        for segment in reversed(self.files.segments):
            end = segment.start + self.segment_size
            if end <= offset:
                break
            if segment.start in self.sealed_ts_ms:
                total -= max(0, min(end, self.write_offset) - max(segment.end, offset))
        return total

    @property
    def min_offset(self) -> int:
        return self.files.min_offset if self.files.segments else self.write_offset

    def append(
        self, records: Sequence[Record], store_ts_ms: int, offsets: list[int] | None = None
    ) -> tuple[int, list[DispatchRun]]:
        """Write ``records``; returns the first record's offset and the entries to dispatch.
        Each record's offset is appended to ``offsets`` when given."""
        runs: list[DispatchRun] = []
        plan: list[tuple[int, bytes | bytearray, bool]] = []
        pos = self.write_offset
        index = 0
        size = self.segment_size
        while index < len(records):
            segment_end = pos - pos % size + size
            chunk = encode_chunk(
                records,
                index,
                pos,
                segment_end - pos,
                store_ts_ms,
                self.max_record_bytes,
                self._dest_cache,
                runs,
                offsets,
            )
            if chunk.record_count:
                plan.append((pos, chunk.data, False))
                pos += len(chunk.data)
                index += chunk.record_count
            if index < len(records):
                plan.append((pos, encode_blank(pos, segment_end - pos, store_ts_ms), True))
                pos = segment_end
        self._write(plan, store_ts_ms)
        self.write_offset = pos
        self.last_store_ts_ms = store_ts_ms
        first = next(offset for offset, _, is_filler in plan if not is_filler)
        return first, runs

    def append_copies(self, raws: Sequence[bytes]) -> list[int]:
        """Append whole records again as copies (the garbage collector's relocation); returns
        their new offsets. All or nothing, like ``append``; nothing is dispatched."""
        plan: list[tuple[int, bytes | bytearray, bool]] = []
        offsets: list[int] = []
        pos = self.write_offset
        size = self.segment_size
        ts = self.last_store_ts_ms
        chunk = bytearray()
        chunk_start = pos
        for raw in raws:
            segment_end = pos - pos % size + size
            if pos + len(raw) > segment_end - BLANK_SIZE:
                if chunk:
                    plan.append((chunk_start, chunk, False))
                    chunk = bytearray()
                plan.append((pos, encode_blank(pos, segment_end - pos, ts), True))
                pos = chunk_start = segment_end
            chunk += relocated_copy(raw, pos)
            offsets.append(pos)
            pos += len(raw)
        if chunk:
            plan.append((chunk_start, chunk, False))
        self._write(plan, ts)
        self.write_offset = pos
        return offsets

    def seal_active(self) -> int:
        """Close the active segment early with a filler and start the next one (empty), so
        that reclaim may delete it; returns the new write offset. Offsets are logical: the
        skipped range costs nothing on disk."""
        pos = self.write_offset
        segment_end = pos - pos % self.segment_size + self.segment_size
        self._write([(pos, encode_blank(pos, segment_end - pos, self.last_store_ts_ms), True)],
                    self.last_store_ts_ms)  # fmt: skip
        self.write_offset = segment_end
        self.files.create(segment_end)
        return segment_end

    def _write(self, plan: list[tuple[int, bytes | bytearray, bool]], store_ts_ms: int) -> None:
        created: list[Segment] = []
        touched: dict[int, tuple[Segment, int]] = {}
        try:
            for offset, data, is_filler in plan:
                segment = self.files.find(offset)
                if segment is None:
                    segment = self.files.create(offset - offset % self.segment_size)
                    created.append(segment)
                else:
                    touched.setdefault(segment.start, (segment, segment.written))
                self.files.write(segment, data, offset - segment.start)
                self.dirty[segment.start] = segment
                if is_filler:
                    self.sealed_ts_ms[segment.start] = store_ts_ms
        except OSError as exc:
            self._roll_back(created, touched)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull("no space left on device; append rolled back", exc.errno) from exc
            raise StoreWriteError(f"commitlog write failed: {exc}", exc.errno) from exc

    def _roll_back(self, created: list[Segment], touched: dict[int, tuple[Segment, int]]) -> None:
        for _ in created:
            self.files.remove_last()
        for segment, written in touched.values():
            self.files.truncate(segment, written)
            self.sealed_ts_ms.pop(segment.start, None)
            self.dirty[segment.start] = segment

    def take_dirty(self) -> list[Segment]:
        dirty = [segment for segment in self.dirty.values() if segment.fd >= 0]
        self.dirty.clear()
        return dirty

    def read(self, offset: int, length: int) -> bytes:
        return self.files.read(offset, length)

    def scan(self, start: int, visit: RecordVisitor | None) -> ScanEnd:
        """Validate records from ``start`` until the data ends or a record fails its checks."""
        pos = start
        while True:
            segment = self.files.find(pos)
            if segment is None:
                return ScanEnd(pos, "")
            rel = pos - segment.start
            avail = segment.written - rel
            if avail <= 0:
                return ScanEnd(pos, "")
            buf = self.files.fs.pread(segment.fd, min(avail, _SCAN_CHUNK_BYTES), rel)
            p = 0
            while p < len(buf):
                found = check_record(buf, p, pos)
                if not found.size:
                    if found.problem.startswith("truncated") and p > 0:
                        break  # the record continues past this chunk: read again from it
                    whole = self._read_large_record(segment, rel, buf, pos, avail)
                    if whole is not None:
                        buf = whole  # a record larger than the chunk: validate it whole
                        continue
                    return ScanEnd(pos, found.problem)
                if found.is_blank:
                    if pos + found.size != segment.start + self.segment_size:
                        return ScanEnd(pos, "filler does not end at the segment boundary")
                    pos = segment.start + self.segment_size
                    break
                if visit is not None and not found.is_hole:
                    visit(pos, buf, p, found.size)
                p += found.size
                pos += found.size

    def _read_large_record(
        self, segment: Segment, rel: int, buf: bytes, pos: int, avail: int
    ) -> bytes | None:
        """The whole record at ``pos`` when it is longer than ``buf`` (the first chunk read
        there), within max_record_bytes and the segment's data, and its header agrees (offset,
        field lengths): memory stays bounded by real records, not by a damaged size field."""
        if len(buf) < HEADER_SIZE:
            return None
        fields = HEADER.unpack_from(buf, 0)
        size = fields[0]
        if not len(buf) < size <= min(avail, self.max_record_bytes):
            return None
        body_end = HEADER_SIZE + DEST_SIZE * fields[7] + sum(fields[8:12])
        if fields[1] not in (MESSAGE_MAGIC, COPY_MAGIC) or fields[3] != pos or body_end != size:
            return None
        whole = self.files.fs.pread(segment.fd, size, rel)
        return whole if len(whole) == size else None

    def truncate_from(self, offset: int) -> None:
        self.recent.clear()
        self.files.truncate_from(offset)
        for start in [s for s in self.sealed_ts_ms if s >= offset - offset % self.segment_size]:
            del self.sealed_ts_ms[start]
        self.write_offset = offset

    def remove_first_segment(self) -> Segment:
        segment = self.files.remove_first()
        self.sealed_ts_ms.pop(segment.start, None)
        self.dirty.pop(segment.start, None)
        return segment

    def close(self) -> None:
        self.files.close()
