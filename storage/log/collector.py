"""Copy-forward garbage collection: free head segments that only a few live records pin.

With one commitlog for every queue, a queue that keeps one old message pins its segment and,
since segments go in order, every later one. When the live records (those some group can
still read) of a window of segments from the head are a small part of it, they are appended
again at the tail as copies, their consume-queue entries are re-pointed at the copies, and
plain reclaim then deletes the window. The window is the shortest sparse-enough run from the
head, so a head made dense by earlier copies goes together with the sparse segments behind
it. The steps, and why each is safe to crash in:

1. ``plan_relocation``: append the copies (magic COPY_MAGIC: recovery never indexes them as new
   messages) and hold the window (``LogStore.gc_hold``) so nothing deletes it meanwhile.
   A crash now leaves unreferenced copies, reclaimed with their own segment later.
2. Once the copies are durable, ``write_journal`` records every re-point in ``gc.journal``
   (written atomically). From here on a restart re-applies the journal before recovery.
3. ``apply_repoints`` rewrites the entries (an entry still pointing at the old record only:
   consumption, purge or a queue delete may have moved on); ``sync_files`` fsyncs them.
4. ``retire_journal`` removes the journal (durably: a stale journal replayed after a later
   collection would point entries back at deleted copies) and releases the hold.

Everything runs on the store's owner except the fsyncs, which the caller may run in a thread.
"""

from __future__ import annotations

import heapq
import logging
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from storage.errors import StoreError
from storage.log.file_system import FileSystem
from storage.log.segment_files import Segment
from storage.record import (
    COPY_MAGIC,
    ENTRY_SIZE_MASK,
    MESSAGE_MAGIC,
    RELOCATED_ENTRY,
    check_record,
)

if TYPE_CHECKING:
    from storage.log.log_store import LogStore

log = logging.getLogger("mqgw.storage")

JOURNAL_NAME = "gc.journal"
_JOURNAL_HEAD = struct.Struct("<III")  # magic, move count, crc32 of the moves
_JOURNAL_MAGIC = 0x4A434731  # "1GCJ"
_MOVE = struct.Struct("<IHQQQIQ")  # queue, partition, logical, old, new, size, timestamp
# A queue whose consumer, at the pace seen since the last look, reads its records out of the
# head within this many looks is waited for: copying what is about to be consumed is waste.
_PATIENCE_PASSES = 4
_MAX_WINDOW = 16  # segments one collection looks at (and at most frees)


@dataclass(frozen=True)
class Move:
    queue_id: int
    partition: int
    logical: int
    old_commit: int
    new_commit: int
    size: int
    ts: int


@dataclass
class Relocation:
    segment_start: int
    moves: list[Move]
    records: int
    copied_bytes: int
    copies_end: int  # durable past here before the journal may be written


@dataclass
class CollectorStats:
    segments: int = 0  # segments freed by relocation
    records: int = 0
    copied_bytes: int = 0

    def add(self, relocation: Relocation) -> None:
        self.segments += 1
        self.records += relocation.records
        self.copied_bytes += relocation.copied_bytes


def plan_relocation(store: LogStore, now_ms: int, max_live_ratio: float) -> Relocation | None:
    """Copy the live records of a window of segments from the head to the tail, when they are
    at most ``max_live_ratio`` of the window's bytes; None when nothing is worth doing.

    The window is the shortest run of sealed segments from the head that is sparse enough:
    a head made dense by earlier copies is then taken together with the sparse segments
    behind it, instead of holding them all (segments go in order). Entries are read one
    segment at a time, so a long backlog behind the window is never scanned."""
    log_ = store.commit_log
    segments = log_.files.segments
    if store.gc_hold is not None or len(segments) < 2 or max_live_ratio <= 0:
        return None
    head = segments[0]
    if store.reclaim_boundary() >= head.start + log_.segment_size:
        return None  # nothing live in the head: plain reclaim deletes it
    window = _candidate_window(store, now_ms)
    starts = store.read_starts()
    seen, store.gc_seen_starts = store.gc_seen_starts, starts
    scans = [_KeyScan(key, store.cqs[key].entries_from(start)) for key, start in starts.items()]
    relocated: list[tuple[int, tuple[int, int], int, int, int]] = []  # heap by commit
    live: dict[int, list[tuple[int, int, int, int, int]]] = {}
    sizes: dict[int, int] = {}
    counts: dict[tuple[int, int], int] = {}
    live_bytes = disk_bytes = 0
    for segment in window:
        end = segment.start + log_.segment_size
        found: list[tuple[int, tuple[int, int], int, int, int]] = []
        for scan in scans:
            found += scan.take_below(end, relocated)
        while relocated and relocated[0][0] < end:
            found.append(heapq.heappop(relocated))
        for commit, key, logical, size, ts in found:
            if commit not in sizes:
                sizes[commit] = size
                live_bytes += size
            live.setdefault(commit, []).append((*key, logical, size, ts))
            counts[key] = counts.get(key, 0) + 1
        disk_bytes += max(segment.written, 1)
        if live_bytes <= max_live_ratio * disk_bytes:
            break
    else:
        return None  # no run from the head is sparse enough (or none is collectable)
    for key, count in counts.items():
        if 0 < count <= (starts[key] - seen.get(key, starts[key])) * _PATIENCE_PASSES:
            return None  # a consumer that keeps this pace frees the window itself
    chosen = sorted(live)
    raws = [_read_record(store, commit, sizes[commit]) for commit in chosen]
    offsets = log_.append_copies(raws) if raws else []
    moves = [
        Move(q, p, logical, commit, new, size, ts)
        for commit, new in zip(chosen, offsets, strict=True)
        for q, p, logical, size, ts in live[commit]
    ]
    store.gc_hold = head.start
    return Relocation(head.start, moves, len(chosen), live_bytes, log_.write_offset)


class _KeyScan:
    """One queue partition's entries from its read start, taken a segment at a time."""

    def __init__(self, key: tuple[int, int], entries: Iterator[tuple[int, int, int, int]]) -> None:
        self.key = key
        self.entries = entries
        self.peeked: tuple[int, int, int, int] | None = None

    def take_below(
        self, end: int, relocated: list[tuple[int, tuple[int, int], int, int, int]]
    ) -> list[tuple[int, tuple[int, int], int, int, int]]:
        """Original entries pointing below ``end`` (they are in commit order); relocated
        ones met on the way go to the ``relocated`` heap, whatever they point at."""
        taken: list[tuple[int, tuple[int, int], int, int, int]] = []
        while True:
            entry = self.peeked if self.peeked is not None else next(self.entries, None)
            self.peeked = None
            if entry is None:
                return taken
            logical, commit, raw_size, ts = entry
            item = (commit, self.key, logical, raw_size & ENTRY_SIZE_MASK, ts)
            if raw_size & RELOCATED_ENTRY:
                heapq.heappush(relocated, item)
            elif commit < end:
                taken.append(item)
            else:
                self.peeked = entry
                return taken


def _candidate_window(store: LogStore, now_ms: int) -> list[Segment]:
    """Sealed segments from the head that recovery no longer needs (at most _MAX_WINDOW)."""
    log_ = store.commit_log
    safe = min(store.durable_offset, store.checkpointed_offset)
    window: list[Segment] = []
    for segment in log_.files.segments[:-1][:_MAX_WINDOW]:
        sealed_ts = log_.sealed_ts_ms.get(segment.start)
        if sealed_ts is None or segment.start + log_.segment_size > safe:
            break  # still being written, or recovery may still need it
        if now_ms - sealed_ts < store.config.min_retention_ms:
            break
        window.append(segment)
    return window


def _read_record(store: LogStore, commit: int, size: int) -> bytes:
    raw = store.commit_log.read(commit, size)
    found = check_record(raw, 0, commit)
    magic = int.from_bytes(raw[4:8], "little") if len(raw) >= 8 else 0
    if found.size != size or magic not in (MESSAGE_MAGIC, COPY_MAGIC):
        raise StoreError(f"garbage collector: record at {commit} is unreadable ({found.problem})")
    return raw


def write_journal(fs: FileSystem, data_dir: Path, relocation: Relocation) -> None:
    moves = b"".join(
        _MOVE.pack(m.queue_id, m.partition, m.logical, m.old_commit, m.new_commit, m.size, m.ts)
        for m in relocation.moves
    )
    head = _JOURNAL_HEAD.pack(_JOURNAL_MAGIC, len(relocation.moves), zlib.crc32(moves))
    fs.write_atomic(data_dir / JOURNAL_NAME, head + moves)


def read_journal(data_dir: Path) -> list[Move] | None:
    """The journal's moves; None when there is none (or it is unreadable: it is written
    atomically, so a damaged one was never complete and nothing was re-pointed after it)."""
    path = data_dir / JOURNAL_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(data) < _JOURNAL_HEAD.size:
        return None
    magic, count, crc = _JOURNAL_HEAD.unpack_from(data)
    body = data[_JOURNAL_HEAD.size :]
    if magic != _JOURNAL_MAGIC or len(body) != count * _MOVE.size or zlib.crc32(body) != crc:
        log.warning("garbage collector: ignoring a damaged %s", path)
        return None
    return [Move(*fields) for fields in _MOVE.iter_unpack(body)]


def apply_repoints(store: LogStore, moves: list[Move], only_unchanged: bool = True) -> list[Path]:
    """Re-point the entries; returns the index files to fsync. With ``only_unchanged`` an
    entry is re-pointed only while it still points at the old record."""
    paths: dict[Path, None] = {}
    for move in moves:
        cq = store.cqs.get((move.queue_id, move.partition))
        if cq is None or not cq.min_offset <= move.logical < cq.max_offset:
            continue  # queue deleted, or the entry dropped since
        if only_unchanged and cq.entry(move.logical)[0] != move.old_commit:
            continue
        segment = cq.repoint(move.logical, move.new_commit, move.size, move.ts)
        paths[segment.path] = None
    return list(paths)


def sync_files(fs: FileSystem, paths: list[Path]) -> None:
    """Runs in a worker thread while the loop goes on: a queue deleted meanwhile took its
    files along, and there is nothing left of them to sync (failing here would keep the
    collection's hold on the head segment until a restart)."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fs.fsync(fd)
        finally:
            os.close(fd)


def retire_journal(fs: FileSystem, data_dir: Path) -> None:
    path = data_dir / JOURNAL_NAME
    if path.exists():
        fs.unlink(path)
        fs.fsync_dir(data_dir)


def replay_journal(store: LogStore) -> int:
    """On open, before recovery: finish a collection a crash interrupted after its journal
    was written (the copies are durable then). Re-points unconditionally: an entry torn by
    the crash is rewritten whole. Returns how many entries were re-pointed."""
    root = store.config.data_dir
    moves = read_journal(root)
    if moves is None:
        retire_journal(store.fs, root)
        return 0
    paths = apply_repoints(store, moves, only_unchanged=False)
    sync_files(store.fs, paths)
    for cq in store.cqs.values():
        cq.refresh_last_commit()
    retire_journal(store.fs, root)
    log.info("garbage collector: re-applied %d relocated entries from the journal", len(moves))
    return len(moves)


def collect_now(store: LogStore, now_ms: int | None = None) -> Relocation | None:
    """One whole collection on the calling thread (tests, offline tools); EmbeddedStore runs
    the same steps with its fsyncs in a worker thread."""
    relocation = plan_relocation(
        store, store.clock() if now_ms is None else now_ms, store.config.gc_max_live_ratio
    )
    if relocation is None:
        return None
    root = store.config.data_dir
    try:
        store.flush()
        write_journal(store.fs, root, relocation)
    except BaseException:
        store.gc_hold = None
        raise
    sync_files(store.fs, apply_repoints(store, relocation.moves))
    retire_journal(store.fs, root)
    store.gc_hold = None
    store.collected.add(relocation)
    return relocation
