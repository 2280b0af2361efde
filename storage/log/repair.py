"""`mqgw storage repair`: make a damaged store openable again, keeping every valid record.

What `storage check` lists is mended in place, under the store's lock (held from the first
read until the indexes are rebuilt, so no node can open the store meanwhile):
- a damaged record followed by valid data in its segment becomes a *hole* of its size, which
  scans and reads skip;
- damage running to a segment's end (or a segment file gone) becomes a 28-byte hole and a
  filler that seals the segment; the next segment is then scanned again;
- only a damaged tail with nothing valid after it is truncated.
Index entries that pointed into a lost range are pointed at the hole that starts it (readers
skip holes, so consumers move on), then the store is opened once without its checkpoint:
recovery re-validates the whole commitlog and re-dispatches whatever the indexes miss.
The damaged messages themselves are not recoverable: copy the store first (docs/operations.md).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from pathlib import Path

from storage.config import StoreConfig
from storage.errors import StoreError
from storage.log.check import (
    CheckReport,
    Problem,
    ProgressCallback,
    find_store_dir,
    layout_config,
    open_log,
    scan_all,
    store_lock,
)
from storage.log.commit_log import CommitLog
from storage.log.file_system import FileSystem
from storage.log.log_store import LogStore
from storage.log.segment_files import segment_name
from storage.record import (
    BLANK_SIZE,
    CQ_ENTRY,
    CQ_ENTRY_SIZE,
    HEADER_SIZE,
    HOLE_MAGIC,
    RELOCATED_ENTRY,
    encode_blank,
)

_MAX_REPAIR_PASSES = 8
# Index entries into lost ranges point at the hole with this size: a reader unpacks a whole
# header before it sees the hole's magic, and every lost range has that many bytes on disk.
_SKIPPED_ENTRY_SIZE = HEADER_SIZE


def repair_dir(
    path: Path,
    progress: ProgressCallback | None = None,
    note: Callable[[str], None] | None = None,
) -> CheckReport:
    """`mqgw storage repair`: like check_dir, holding the lock until the rebuild is done."""
    store_dir = find_store_dir(path)
    with store_lock(store_dir) as lock_fd:
        config = layout_config(store_dir)
        return _repair_locked(config, FileSystem(), lock_fd, progress, note)


def repair_store(
    config: StoreConfig,
    fs: FileSystem | None = None,
    progress: ProgressCallback | None = None,
    note: Callable[[str], None] | None = None,
) -> CheckReport:
    """Fix what check finds, then open the store once so indexes are rebuilt and checked.
    Holds the store's lock from the first read to the end."""
    with store_lock(config.data_dir) as lock_fd:
        return _repair_locked(config, fs or FileSystem(), lock_fd, progress, note)


def _repair_locked(
    config: StoreConfig,
    fs: FileSystem,
    lock_fd: int,
    progress: ProgressCallback | None,
    note: Callable[[str], None] | None,
) -> CheckReport:
    fixed: list[Problem] = []
    lost: list[tuple[int, int]] = []  # [start, end) whose records are gone; a hole at start
    report = CheckReport()
    for attempt in range(_MAX_REPAIR_PASSES):
        commit_log = open_log(config, fs)
        try:
            report = scan_all(commit_log, progress)
            if report.ok:
                break
            if attempt == _MAX_REPAIR_PASSES - 1:
                raise StoreError(
                    f"repair gave up: damage remains at {report.problems[0].describe()}"
                )
            rescan = False
            for problem in report.problems:
                rescan |= _fix(commit_log, problem, fs, lost)
                fixed.append(problem)
        finally:
            commit_log.close()
        if not rescan:
            break  # holes and a truncation leave nothing unscanned: the rebuild checks again
        if note is not None:
            note("a segment was sealed early: scanning again for what follows it")
    report.problems = fixed
    patched = _point_entries_at_holes(config.data_dir / "consumequeue", lost, fs)
    if note is not None:
        pointed = f" ({patched} index entries now point at holes)" if patched else ""
        note(f"rebuilding the indexes: one more full scan{pointed}")
    # Re-dispatch everything: entries may point into what was truncated.
    (config.data_dir / "checkpoint.json").unlink(missing_ok=True)
    store = LogStore.open(config, fs, held_lock_fd=lock_fd)
    report.recovery = store.recovery
    store.close()
    return report


def _fix(
    commit_log: CommitLog, problem: Problem, fs: FileSystem, lost: list[tuple[int, int]]
) -> bool:
    """Mend one damaged place; True when what follows it must be scanned again.

    Every lost range starts with a hole, so index entries into it can be pointed there
    (readers skip holes). Damage running to a segment's end becomes a 28-byte hole and a
    filler behind it; the file then ends with the filler, as a sealed segment's does."""
    files = commit_log.files
    size = commit_log.segment_size
    bad, resume = problem.offset, problem.resume_at
    segment = files.find(bad)
    if resume is None:
        removed = sum(s.end - max(s.start, bad) for s in files.segments if s.end > bad)
        commit_log.truncate_from(bad)  # recovery drops the index entries past the new end
        if files.last is not None:
            fs.fsync(files.last.fd)
        problem.action = f"truncated here ({removed} bytes of damaged tail removed)"
        return False
    start = bad - bad % size
    seal = _hole_and_filler(bad, start + size, problem.last_store_ts_ms)
    if segment is None:  # the segment's file is gone: recreate it, empty and sealed
        fd = fs.open(files.directory / segment_name(start))
        try:
            fs.pwrite(fd, seal, 0)
            fs.fsync(fd)
        finally:
            fs.close(fd)
        lost.append((start, start + size))
        problem.action = "missing segment file recreated, empty and sealed"
        return True
    rel = bad - segment.start
    if resume < segment.start + size:
        files.write(segment, encode_blank(bad, resume - bad, 0, HOLE_MAGIC), rel)
        lost.append((bad, resume))
        problem.action = f"replaced by a hole of {resume - bad} bytes"
    else:
        dropped = segment.written - rel
        files.write(segment, seal, rel)
        files.truncate(segment, rel + len(seal))
        lost.append((bad, start + size))
        problem.action = f"segment sealed here ({dropped} damaged bytes dropped)"
    fs.fsync(segment.fd)
    return resume >= segment.start + size


def _hole_and_filler(offset: int, segment_end: int, last_store_ts_ms: int) -> bytes:
    """Close a segment at ``offset``: a 28-byte hole then a filler, or a filler alone when
    there is no room for both (then no record can have been there)."""
    if segment_end - offset < 2 * BLANK_SIZE:
        return encode_blank(offset, segment_end - offset, last_store_ts_ms)
    hole = encode_blank(offset, BLANK_SIZE, 0, HOLE_MAGIC)
    filler_at = offset + BLANK_SIZE
    return hole + encode_blank(filler_at, segment_end - filler_at, last_store_ts_ms)


def _point_entries_at_holes(root: Path, lost: list[tuple[int, int]], fs: FileSystem) -> int:
    """Rewrite consume-queue entries into lost ranges to point at the hole: readers skip them,
    so a consumer moves past the lost messages. Queue offsets and timestamps are unchanged."""
    if not lost or not root.is_dir():
        return 0
    lost = sorted(lost)
    starts = [start for start, _ in lost]

    def hole_for(commit: int) -> int | None:
        i = bisect.bisect_right(starts, commit) - 1
        return lost[i][0] if i >= 0 and commit < lost[i][1] else None

    patched = 0
    for path in sorted(root.glob("*/*/*")):
        data = bytearray(path.read_bytes())
        count = len(data) // CQ_ENTRY_SIZE
        if not count:
            continue
        # Every entry is checked: re-pointed entries (storage/log/collector.py) break commit order.
        for k in range(count):
            commit, size, ts = CQ_ENTRY.unpack_from(data, k * CQ_ENTRY_SIZE)
            hole = hole_for(commit)
            if hole is not None:
                skipped = _SKIPPED_ENTRY_SIZE | (size & RELOCATED_ENTRY)
                CQ_ENTRY.pack_into(data, k * CQ_ENTRY_SIZE, hole, skipped, ts)
                patched += 1
        fd = fs.open(path, create=False)
        try:
            fs.pwrite(fd, bytes(data), 0)
            fs.fsync(fd)
        finally:
            fs.close(fd)
    return patched
