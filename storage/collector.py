"""Copy-forward garbage collection: free a head segment that only a few live records pin.

With one commitlog for every queue, a queue that keeps one old message pins its segment and,
since segments go in order, every later one. When the head segment's live records (those some
group can still read) are a small part of it, they are appended again at the tail as copies,
their consume-queue entries are re-pointed at the copies, and plain reclaim then deletes the
segment. The steps, and why each is safe to crash in:

1. ``plan_relocation``: append the copies (magic COPY_MAGIC: recovery never indexes them as new
   messages) and hold the segment (``LogStore.gc_hold``) so nothing deletes it meanwhile.
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

import logging
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from storage.errors import StoreError
from storage.file_system import FileSystem
from storage.record import COPY_MAGIC, MESSAGE_MAGIC, check_record

if TYPE_CHECKING:
    from storage.log_store import LogStore

log = logging.getLogger("mqgw.storage")

JOURNAL_NAME = "gc.journal"
_JOURNAL_HEAD = struct.Struct("<III")  # magic, move count, crc32 of the moves
_JOURNAL_MAGIC = 0x4A434731  # "1GCJ"
_MOVE = struct.Struct("<IHQQQIQ")  # queue, partition, logical, old, new, size, timestamp
# A queue whose consumer, at the pace seen since the last look, reads its records out of the
# head within this many looks is waited for: copying what is about to be consumed is waste.
_PATIENCE_PASSES = 4


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
    """Copy the head segment's live records to the tail when they are at most
    ``max_live_ratio`` of a segment; None when there is nothing worth doing."""
    log_ = store.commit_log
    segments = log_.files.segments
    if store.gc_hold is not None or len(segments) < 2 or max_live_ratio <= 0:
        return None
    head = segments[0]
    head_end = head.start + log_.segment_size
    sealed_ts = log_.sealed_ts_ms.get(head.start)
    if sealed_ts is None or head_end > min(store.durable_offset, store.checkpointed_offset):
        return None  # still being written, or recovery may still need it
    if now_ms - sealed_ts < store.config.min_retention_ms:
        return None
    if store.reclaim_boundary() >= head_end:
        return None  # nothing live in it: plain reclaim deletes it
    live: dict[int, list[tuple[int, int, int, int, int]]] = {}
    sizes: dict[int, int] = {}
    starts = store.read_starts()
    leaving_soon = False
    for key, start in starts.items():
        queue_id, partition = key
        found = store.cqs[key].entries_into(start, head.start, head_end)
        progress = start - store.gc_seen_starts.get(key, start)
        if found and 0 < len(found) <= progress * _PATIENCE_PASSES:
            leaving_soon = True  # a consumer that keeps this pace frees the head itself
        for logical, commit, size, ts in found:
            live.setdefault(commit, []).append((queue_id, partition, logical, size, ts))
            sizes[commit] = size
    store.gc_seen_starts = starts
    live_bytes = sum(sizes.values())
    if not live or leaving_soon or live_bytes > max_live_ratio * log_.segment_size:
        return None
    commits = sorted(live)
    raws = [_read_record(store, commit, sizes[commit]) for commit in commits]
    offsets = log_.append_copies(raws)
    moves = [
        Move(q, p, logical, commit, new, size, ts)
        for commit, new in zip(commits, offsets, strict=True)
        for q, p, logical, size, ts in live[commit]
    ]
    store.gc_hold = head.start
    return Relocation(head.start, moves, len(commits), live_bytes, log_.write_offset)


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
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
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
