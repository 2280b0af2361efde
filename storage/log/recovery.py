"""Recovery on open: find the end of the valid commitlog, cut a torn tail, rebuild indexes.

Theory: the checkpoint names a record boundary below which the commitlog was durable and every
consume-queue entry was fsynced. From there we validate every record (magic, size, offset, CRC).
Where validation stops we decide between two cases:
- torn tail: nothing valid follows (a write the crash interrupted) -> truncate, open normally;
- corruption: a valid record follows the bad one, or the data ends before the checkpoint ->
  raise CorruptionError naming segment and offset; `mqgw storage repair` is the way forward.
Then consume-queue entries pointing past the end are dropped, and entries missing after the
checkpoint are re-dispatched from the records' destination lists (idempotent: an entry is only
added when its record lies beyond the queue's last entry, and not before its partition was added:
QueueInfo.added_at). A record flagged CLOSES closes its partitions again (LogStore.mark_closed).

Nothing here needs free space to succeed. Cutting a torn tail and dropping index entries only
shrink files (and the cut is fsynced with the tail segment, whatever happens to the checkpoint).
The new checkpoint is only an optimisation: on a full disk it is not written, the old one stays
valid (an earlier start for the next recovery) and housekeeping writes it later. Index entries
that cannot be re-dispatched for lack of space are rolled back to whole entries and left to
``finish_recovery``: until it succeeds appends are refused (DiskFull) and no checkpoint is
written, so the indexes never grow a gap and a crash meanwhile simply recovers again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from storage.errors import CorruptionError
from storage.log.commit_log import CommitLog, ScanEnd
from storage.log.segment_files import segment_name
from storage.log.state_files import Checkpoint
from storage.record import (
    BLANK_MAGIC,
    BLANK_SIZE,
    CLOSES,
    COPY_MAGIC,
    CQ_ENTRY,
    CQ_ENTRY_SIZE,
    DEST,
    DEST_SIZE,
    HEAD,
    HEADER,
    HEADER_SIZE,
    HOLE_MAGIC,
    check_record,
)
from storage.results import RecoveryReport

if TYPE_CHECKING:
    from storage.log.log_store import LogStore

log = logging.getLogger("mqgw.storage")

_PENDING_FLUSH_BYTES = 4 << 20
_RETRY_FIRST_S = 1.0
_RETRY_MAX_S = 64.0


def recover(store: LogStore, checkpoint: Checkpoint) -> RecoveryReport:
    commit_log = store.commit_log
    files = commit_log.files
    start = max(checkpoint.dispatched, files.min_offset)
    # The checkpoint on disk: valid (if old) whether or not a new one can be written.
    store.checkpointed_offset = start
    data_end = commit_log.logical_end
    if files.segments and start > data_end:
        raise CorruptionError(
            segment_name(start - start % commit_log.segment_size),
            start,
            f"commitlog ends at {data_end}, before the checkpoint at {start}",
        )
    end = commit_log.scan(start, None)
    truncated = 0
    if end.offset < data_end:
        if end.offset < checkpoint.dispatched or valid_data_after(commit_log, end):
            raise CorruptionError(
                segment_name(end.offset - end.offset % commit_log.segment_size),
                end.offset,
                end.problem or "gap in the commitlog",
            )
        truncated = data_end - end.offset
        log.warning(
            "commitlog: torn tail at offset %d (%s): truncating %d bytes",
            end.offset,
            end.problem,
            truncated,
        )
    commit_log.truncate_from(end.offset)
    dropped = sum(cq.truncate_to_commit_offset(end.offset) for cq in store.cqs.values())
    for cq in store.cqs.values():
        # A partly expired first segment: the minimum is the first entry still in the log.
        cq.drop_before_commit_offset(commit_log.min_offset)
    pending = store.pending_index = PendingIndex(start)
    redispatched = _attempt(store, pending) or 0
    # What we recovered may sit unsynced in the page cache after a kill: make it durable now,
    # so the durable offset and the next checkpoint are honest.
    if files.last is not None:
        commit_log.dirty[files.last.start] = files.last
    for cq in store.cqs.values():
        if cq.files.last is not None:
            cq.dirty[cq.files.last.start] = cq.files.last
    store.flush()
    # The indexes are fsynced whether or not the checkpoint file can be written (a full
    # disk): entries cut above must not come back once appends resume.
    store.checkpoint(store.begin_checkpoint())
    report = RecoveryReport(start, end.offset, truncated, redispatched, dropped)
    if truncated or redispatched or dropped:
        log.info("recovery: %s", report)
    return report


@dataclass
class PendingIndex:
    """Index entries recovery could not write for lack of space: re-dispatched from
    ``start`` (idempotent) by ``finish_recovery``."""

    start: int
    retry_at: float = 0.0  # time.monotonic()
    backoff_s: float = _RETRY_FIRST_S


def finish_recovery(store: LogStore, wait: bool = True) -> bool:
    """Add the index entries recovery could not write; True once none are missing. Runs on
    the store's owner (it writes the indexes). Each attempt rescans the log from the old
    checkpoint, so with ``wait`` (housekeeping) a failed one is repeated only after a pause
    growing from 1 s to 64 s; ``wait=False`` tries now."""
    pending = store.pending_index
    if pending is None:
        return True
    if wait and time.monotonic() < pending.retry_at:
        return False
    return _attempt(store, pending) is not None


def _attempt(store: LogStore, pending: PendingIndex) -> int | None:
    """Re-dispatch; the number of entries added, or None when the disk is still full (the
    indexes are then cut back to whole entries)."""
    counted: list[int] = []
    if store.deferred.attempt(
        "recovered index entries", lambda: counted.append(_redispatch(store, pending.start))
    ):
        store.pending_index = None
        return counted[0]
    _drop_partial_entries(store)
    pending.retry_at = time.monotonic() + pending.backoff_s
    pending.backoff_s = min(2 * pending.backoff_s, _RETRY_MAX_S)
    return None


def _drop_partial_entries(store: LogStore) -> None:
    """A write that failed part-way may leave bytes (even a new file) past an index's last
    whole entry: cut them, so that nothing but whole entries is ever read or reloaded."""
    for cq in store.cqs.values():
        end = cq.max_offset * CQ_ENTRY_SIZE
        cq.files.truncate_from(end)
        last = cq.files.last
        if last is not None and last.start <= end:
            cq.files.truncate(last, end - last.start)


def valid_data_after(commit_log: CommitLog, end: ScanEnd) -> bool:
    """Is there a valid record after the one that failed? Then the failure is corruption."""
    return next_valid_offset(commit_log, end.offset) is not None


def next_valid_offset(commit_log: CommitLog, bad: int) -> int | None:
    """Where valid data resumes after a bad record at ``bad`` (None: nothing valid follows).

    Looks at the record its size field points to, then at the start of each later segment.
    """
    files = commit_log.files
    segment = files.find(bad)
    if segment is not None:
        head = files.fs.pread(segment.fd, HEAD.size, bad - segment.start)
        if len(head) == HEAD.size:
            size = int(HEAD.unpack(head)[0])
            if HEADER_SIZE <= size <= commit_log.max_record_bytes and record_starts_at(
                commit_log, bad + size
            ):
                return bad + size
    for later in files.segments:
        if later.start > bad and later.written and record_starts_at(commit_log, later.start):
            return later.start
    return None


def record_starts_at(commit_log: CommitLog, offset: int) -> bool:
    """Does a valid record (or filler, or hole) start at ``offset``? Reads only its size."""
    head = commit_log.files.read(offset, HEAD.size)
    if len(head) < HEAD.size:
        return False
    size, magic, _ = HEAD.unpack(head)
    length = BLANK_SIZE if magic in (BLANK_MAGIC, HOLE_MAGIC) else int(size)
    if not HEAD.size <= length <= commit_log.max_record_bytes:
        return False
    return bool(check_record(commit_log.files.read(offset, length), 0, offset).size)


def _redispatch(store: LogStore, start: int) -> int:
    last_seen = {key: cq.last_commit_offset for key, cq in store.cqs.items()}
    added = {
        (q, p): at
        for q, info in store.registry.queues.items()
        for p, at in enumerate(info.added_at)
    }
    pending: dict[tuple[int, int], bytearray] = {}
    pending_bytes = 0
    count = 0

    def flush_pending() -> None:
        nonlocal pending_bytes
        for key, entries in pending.items():
            store.cqs[key].append(entries, last_seen[key])
        pending.clear()
        pending_bytes = 0

    def visit(commit: int, buf: bytes, pos: int, size: int) -> None:
        nonlocal pending_bytes, count
        fields = HEADER.unpack_from(buf, pos)
        if fields[1] == COPY_MAGIC:
            return  # a relocated record: its entries already exist (see storage/log/collector.py)
        store_ts, dest_count, closes = fields[5], fields[7], fields[6] & CLOSES
        for i in range(dest_count):
            queue_id, partition, _ = DEST.unpack_from(buf, pos + HEADER_SIZE + i * DEST_SIZE)
            key = (queue_id, partition)
            if key not in last_seen or commit < added[key]:
                continue
            if closes:  # even when indexed already: the registry saying so may not be saved
                store.mark_closed(key)
            if commit <= last_seen[key]:
                continue
            pending.setdefault(key, bytearray()).extend(CQ_ENTRY.pack(commit, size, store_ts))
            last_seen[key] = commit
            pending_bytes += CQ_ENTRY.size
            count += 1
        if pending_bytes > _PENDING_FLUSH_BYTES:
            flush_pending()

    store.commit_log.scan(start, visit)
    flush_pending()
    return count
