"""A directory of fixed-size segment files named by their 20-digit start offset.

The counterpart of RocketMQ's MappedFileQueue, with positional reads and writes instead of
mmap: a write failure (ENOSPC, EIO) then surfaces as an OSError we can roll back, and reading
a long backlog does not grow the process RSS with mapped pages. Segments are logically
``segment_size`` bytes long but only the written part exists on disk.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from pathlib import Path

from storage.log.file_system import FileSystem

_NAME = re.compile(r"^\d{20}$")


def segment_name(start: int) -> str:
    return f"{start:020d}"


@dataclass
class Segment:
    start: int
    path: Path
    fd: int
    written: int  # bytes present in the file, relative to start

    @property
    def end(self) -> int:
        return self.start + self.written


class SegmentFiles:
    """Ordered segments of one log (a commitlog, or one consume queue)."""

    def __init__(self, fs: FileSystem, directory: Path, segment_size: int) -> None:
        self.fs = fs
        self.directory = directory
        self.segment_size = segment_size
        self.segments: list[Segment] = []
        self._starts: list[int] = []

    def load(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in sorted(p for p in self.directory.iterdir() if _NAME.match(p.name)):
            start = int(path.name)
            if start % self.segment_size:
                raise ValueError(f"{path} does not start on a segment boundary")
            fd = self.fs.open(path)
            self._append(Segment(start, path, fd, self.fs.size(fd)))

    def _append(self, segment: Segment) -> None:
        self.segments.append(segment)
        self._starts.append(segment.start)

    @property
    def min_offset(self) -> int:
        return self.segments[0].start if self.segments else 0

    @property
    def last(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    def create(self, start: int) -> Segment:
        path = self.directory / segment_name(start)
        fd = self.fs.open(path)
        # A file left over from a rolled-back append may hold stale bytes: start it empty.
        self.fs.ftruncate(fd, 0)
        segment = Segment(start, path, fd, 0)
        self._append(segment)
        return segment

    def find(self, offset: int) -> Segment | None:
        """The segment whose logical range holds ``offset``."""
        i = bisect.bisect_right(self._starts, offset) - 1
        if i < 0:
            return None
        segment = self.segments[i]
        return segment if offset < segment.start + self.segment_size else None

    def read(self, offset: int, length: int) -> bytes:
        """Bytes at [offset, offset+length), possibly spanning segments; short at the end."""
        parts: list[bytes] = []
        while length > 0:
            segment = self.find(offset)
            if segment is None:
                break
            rel = offset - segment.start
            n = min(length, segment.written - rel)
            if n <= 0:
                break
            data = self.fs.pread(segment.fd, n, rel)
            parts.append(data)
            if len(data) < n:
                break
            offset += n
            length -= n
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def write(self, segment: Segment, data: bytes | bytearray | memoryview, rel: int) -> None:
        """Write all of ``data`` at ``rel``; the caller rolls back on OSError."""
        view = memoryview(data)
        pos = rel
        while view:
            n = self.fs.pwrite(segment.fd, view, pos)
            view = view[n:]
            pos += n
        segment.written = max(segment.written, pos)

    def truncate(self, segment: Segment, rel: int) -> None:
        self.fs.ftruncate(segment.fd, rel)
        segment.written = rel

    def truncate_from(self, offset: int) -> None:
        """Drop everything at and after ``offset``; a segment starting there stays, empty."""
        while self.segments and self.segments[-1].start > offset:
            self.remove_last()
        last = self.last
        if last is not None and last.end > offset:
            self.truncate(last, offset - last.start)

    def remove_last(self) -> None:
        segment = self.segments.pop()
        self._starts.pop()
        self._close(segment)
        self.fs.unlink(segment.path)

    def remove_first(self) -> Segment:
        segment = self.segments.pop(0)
        self._starts.pop(0)
        self._close(segment)
        self.fs.unlink(segment.path)
        return segment

    def _close(self, segment: Segment) -> None:
        # fd -1 marks the segment dead for anyone still holding it (e.g. a pending fsync list).
        self.fs.close(segment.fd)
        segment.fd = -1

    def total_bytes(self) -> int:
        return sum(s.written for s in self.segments)

    def close(self) -> None:
        for segment in self.segments:
            self._close(segment)
        self.segments.clear()
        self._starts.clear()

    def delete_all(self) -> None:
        while self.segments:
            self.remove_last()
