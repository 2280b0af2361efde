"""`mqgw storage check`, and what it shares with `mqgw storage repair` (storage/log/repair.py).

check reads every commitlog record from the first segment (not only the tail recovery looks
at) and lists each problem with its segment and offset, and where valid data resumes: the
first valid record after it, found by its magic and self-describing offset even when the
damaged record's size field is wrong.

Both tools run only on a store nobody else has open: they take the LOCK file's flock (the one
LogStore takes) before reading anything. They accept `mqgw serve`'s data dir or its store/.
The largest record they accept comes from the store's layout (its segment size), never from
today's settings: a node may have written records as large as its max_message_size_bytes
allowed, and each of those must check clean.
"""

from __future__ import annotations

import bisect
import fcntl
import itertools
import os
import re
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from storage.config import StoreConfig
from storage.errors import StoreError
from storage.log.commit_log import CommitLog
from storage.log.file_system import FileSystem
from storage.log.opening import read_layout
from storage.log.recovery import next_valid_offset, record_starts_at
from storage.log.segment_files import segment_name
from storage.record import (
    BLANK_MAGIC,
    BLANK_SIZE,
    COPY_MAGIC,
    HEADER,
    HEADER_SIZE,
    HOLE_MAGIC,
    MESSAGE_MAGIC,
)
from storage.results import RecoveryReport

_RESYNC_CHUNK_BYTES = 4 << 20
_MAGICS = re.compile(
    b"|".join(
        re.escape(struct.pack("<I", m))
        for m in (MESSAGE_MAGIC, COPY_MAGIC, BLANK_MAGIC, HOLE_MAGIC)
    )
)


class StoreToolError(StoreError):
    """Refused before anything was changed: not a store, in use, unreadable layout."""


@dataclass(frozen=True)
class ScanProgress:
    segments_done: int
    segments_total: int
    bytes_done: int
    bytes_total: int
    records: int


ProgressCallback = Callable[[ScanProgress], None]


@dataclass
class Problem:
    segment: str
    offset: int
    reason: str
    resume_at: int | None  # where valid data continues; None for a damaged tail
    last_store_ts_ms: int = 0  # of the last valid record before it: a repair filler's stamp
    action: str = ""  # what repair did about it

    def describe(self) -> str:
        where = f"{self.segment} @ {self.offset}"
        after = (
            "nothing valid after it" if self.resume_at is None else f"valid from {self.resume_at}"
        )
        done = f": {self.action}" if self.action else ""
        return f"{where}: {self.reason} ({after}){done}"


@dataclass
class CheckReport:
    segments: int = 0
    records: int = 0
    bytes: int = 0  # commitlog bytes on disk
    end_offset: int = 0
    problems: list[Problem] = field(default_factory=list)
    recovery: RecoveryReport | None = None  # repair: the rebuild's recovery report

    @property
    def ok(self) -> bool:
        return not self.problems


# -- finding, locking and reading the layout of a store ------------------------------------------


def record_limit(segment_size: int) -> int:
    """The largest record a store with this segment size can hold, whatever the settings of
    the node that wrote it: CommitLog refuses a max_record_bytes above the segment minus room
    for two fillers, so no record on disk is larger."""
    return segment_size - 2 * BLANK_SIZE


def find_store_dir(path: Path) -> Path:
    """The store directory for ``path``: `mqgw serve`'s data dir (holding store/) or the store
    dir itself (holding layout.json). Only looks at names: nothing is read yet."""
    if not path.is_dir():
        raise StoreToolError(f"{path} is not a directory")
    for candidate in (path, path / "store"):
        if (candidate / "layout.json").is_file():
            return candidate
    raise StoreToolError(
        f"{path} holds no mqgw store: expected the data directory `mqgw serve` uses "
        "(with store/ and meta/) or its store/ directory (with layout.json and commitlog/)"
    )


def lock_holder_pid(lock_path: Path) -> int | None:
    """The pid holding a flock on ``lock_path``, from /proc/locks (Linux); None if unknown."""
    try:
        stat = lock_path.stat()
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    device = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    same_inode: list[int] = []
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":  # "->" lines are waiters, not holders
            continue
        pid, where = int(fields[4]) if fields[4].isdigit() else 0, fields[5]
        if pid > 0 and where == device:
            return pid
        if pid > 0 and where.rsplit(":", 1)[-1] == str(stat.st_ino):
            same_inode.append(pid)  # overlay file systems report another device number
    return same_inode[0] if len(same_inode) == 1 else None


@contextmanager
def store_lock(store_dir: Path) -> Iterator[int]:
    """Hold the store's LOCK flock (as LogStore does); StoreToolError if a node holds it."""
    lock_path = store_dir / "LOCK"
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        try:
            fd = os.open(lock_path, os.O_RDONLY)  # a read-only copy: flock works all the same
        except OSError as exc:
            raise StoreToolError(f"cannot open {lock_path}: {exc.strerror}") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = lock_holder_pid(lock_path)
            raise StoreToolError(
                f"the store at {store_dir} is in use by a running node "
                f"(pid {pid if pid is not None else 'unknown'}): stop it first. Check and "
                "repair need the store to themselves; nothing was read or changed "
                "(docs/operations.md: copy the store, then check the copy)"
            ) from None
        yield fd
    finally:
        os.close(fd)


def layout_config(store_dir: Path) -> StoreConfig:
    """A config matching an existing store's layout.json, with the layout's record limit."""
    try:
        layout = read_layout(store_dir)
    except (OSError, ValueError) as exc:
        raise StoreToolError(f"{store_dir / 'layout.json'} is unreadable: {exc}") from exc
    if layout is None:
        raise StoreToolError(f"{store_dir} holds no mqgw store (no layout.json)")
    segment_size = layout.get("segment_size_bytes") if isinstance(layout, dict) else None
    cq_entries = layout.get("cq_entries_per_segment") if isinstance(layout, dict) else None
    if not isinstance(segment_size, int) or not isinstance(cq_entries, int):
        raise StoreToolError(f"{store_dir / 'layout.json'} is not a store layout: {layout!r}")
    if segment_size <= 4 * BLANK_SIZE or cq_entries <= 0:
        raise StoreToolError(f"{store_dir / 'layout.json'} holds impossible sizes: {layout!r}")
    return StoreConfig(
        store_dir,
        segment_size_bytes=segment_size,
        cq_entries_per_segment=cq_entries,
        max_record_bytes=record_limit(segment_size),
    )


def config_for(path: Path) -> StoreConfig:
    """A config matching an existing store's layout; ``path``: the data dir or the store dir."""
    return layout_config(find_store_dir(path))


# -- scanning ------------------------------------------------------------------------------------


def open_log(config: StoreConfig, fs: FileSystem) -> CommitLog:
    commit_log = CommitLog(
        fs, config.data_dir / "commitlog", config.segment_size_bytes, config.max_record_bytes
    )
    if not commit_log.files.directory.is_dir():
        return commit_log  # a store that never held a record: nothing to check (and no mkdir)
    commit_log.load()
    return commit_log


def scan_all(commit_log: CommitLog, progress: ProgressCallback | None = None) -> CheckReport:
    files = commit_log.files
    starts = [s.start for s in files.segments]
    written = [s.written for s in files.segments]
    before = list(itertools.accumulate(written, initial=0))
    report = CheckReport(segments=len(starts), bytes=before[-1])
    data_end = files.last.end if files.last is not None else 0
    last_record = -1

    def tell(offset: int) -> None:
        assert progress is not None
        i = max(bisect.bisect_right(starts, offset) - 1, 0)
        done = before[i] + min(max(offset - starts[i], 0), written[i])
        progress(ScanProgress(i, len(starts), done, report.bytes, report.records))

    def count(commit: int, _buf: bytes, _pos: int, size: int) -> None:
        nonlocal last_record
        report.records += 1
        last_record = commit
        if progress is not None and (report.records & 1023 == 0 or size >= 1 << 20):
            tell(commit + size)

    pos = files.min_offset
    while True:
        end = commit_log.scan(pos, count)
        report.end_offset = end.offset
        if end.offset >= data_end:
            break
        segment = segment_name(end.offset - end.offset % commit_log.segment_size)
        resume = _resume_after(commit_log, end.offset)
        last_ts = HEADER.unpack(files.read(last_record, HEADER.size))[5] if last_record >= 0 else 0
        problem = Problem(
            segment, end.offset, end.problem or "gap in the commitlog", resume, last_ts
        )
        report.problems.append(problem)
        if resume is None:
            break
        pos = resume
    if progress is not None:
        progress(ScanProgress(len(starts), len(starts), report.bytes, report.bytes, report.records))
    return report


def _resume_after(commit_log: CommitLog, bad: int) -> int | None:
    """Where valid data resumes after ``bad``: the first valid record later in its segment
    (found by its magic and self-describing offset, even when the damaged record's size field
    is wrong), else where the size field or a later segment's start leads (recovery's rule)."""
    segment = commit_log.files.find(bad)
    if segment is not None:
        # The damaged record was at least a header long; a magic sits 4 bytes into a record.
        base = bad + HEADER_SIZE + 4
        while base < segment.end:
            chunk = commit_log.files.read(base, min(_RESYNC_CHUNK_BYTES + 4, segment.end - base))
            for match in _MAGICS.finditer(chunk):
                candidate = base + match.start() - 4
                if record_starts_at(commit_log, candidate):
                    return candidate
            base += _RESYNC_CHUNK_BYTES
    return next_valid_offset(commit_log, bad)


# -- check ---------------------------------------------------------------------------------------


def check_dir(path: Path, progress: ProgressCallback | None = None) -> CheckReport:
    """`mqgw storage check`: ``path`` is the data dir or the store dir; lock, then read."""
    store_dir = find_store_dir(path)
    with store_lock(store_dir):
        return _check_locked(layout_config(store_dir), FileSystem(), progress)


def check_store(
    config: StoreConfig, fs: FileSystem | None = None, progress: ProgressCallback | None = None
) -> CheckReport:
    """Validate every record; takes the store's lock (StoreToolError if a node has it)."""
    with store_lock(config.data_dir):
        return _check_locked(config, fs or FileSystem(), progress)


def _check_locked(
    config: StoreConfig, fs: FileSystem, progress: ProgressCallback | None
) -> CheckReport:
    commit_log = open_log(config, fs)
    try:
        return scan_all(commit_log, progress)
    finally:
        commit_log.close()
