"""LogStore: the synchronous core of the store (commitlog + consume queues + offsets).

Single-threaded by contract: one owner (the event loop of the embedded gateway, or a broker
process) calls it. Only fsync may run elsewhere: ``begin_flush``/``begin_checkpoint`` hand
out duplicated file descriptors that a worker thread syncs while appends go on.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import resource
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from storage.config import StoreConfig
from storage.errors import (
    CorruptionError,
    DiskFull,
    StoreClosed,
    StoreError,
    StoreLocked,
    StoreWriteError,
    UnknownQueue,
)
from storage.log.collector import CollectorStats, replay_journal
from storage.log.commit_log import CommitLog
from storage.log.consume_queue import ConsumeQueue
from storage.log.file_system import FileSystem
from storage.log.recovery import PendingIndex, finish_recovery, recover
from storage.log.segment_files import segment_name
from storage.log.shared_reads import SHARE_FROM_BYTES, SharedReads, SharedRecord
from storage.log.state_files import (
    Checkpoint,
    ConsumerOffsets,
    DeferredWrites,
    QueueInfo,
    QueueRegistry,
    RegistrySnapshot,
    write_new_layout,
)
from storage.record import (
    COPY_MAGIC,
    CQ_ENTRY,
    CQ_ENTRY_SIZE,
    DEST_SIZE,
    ENTRY_SIZE_MASK,
    HEADER,
    HEADER_SIZE,
    HOLE_MAGIC,
    MESSAGE_MAGIC,
    PERSISTENT,
    DispatchRun,
    Record,
    StoredMessage,
)
from storage.results import (
    QUEUE_GROUP,
    AppendResult,
    DeliveryProgress,
    PartitionStats,
    QueueStats,
    ReadResult,
    ReadStatus,
    RecoveryReport,
    RetentionReport,
)

log = logging.getLogger("mqgw.storage")

Clock = Callable[[], int]  # milliseconds since the epoch

_READ_GAP_BYTES = 64 << 10  # records this close together are fetched with one pread
_SYNCFS_ABOVE_FILES = 64  # more dirty index files than this: one syncfs instead of fsyncs
_CLEAN_MARKER = "CLEAN"  # written by close(), removed at open
_NO_REPORT = (-1, 0, 0, 0)  # PartitionStats' progress fields when none was reported


def read_layout(data_dir: Path) -> dict[str, int] | None:
    path = data_dir / "layout.json"
    if not path.exists():
        return None
    layout: dict[str, int] = json.loads(path.read_bytes())
    return layout


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class FlushTicket:
    """Files to fsync and the offset that is durable once they are synced.

    The commitlog's few segments travel as duplicated descriptors (the hot path); consume-queue
    files travel as paths, opened one at a time by the syncing thread, so a checkpoint of
    10,000 queues needs one extra descriptor, not 10,000.
    """

    def __init__(
        self,
        fds: list[int],
        offset: int,
        paths: list[Path] | None = None,
        root: Path | None = None,
        registry: RegistrySnapshot | None = None,
    ) -> None:
        self.fds = fds
        self.paths = paths or []
        self.root = root  # the store directory: syncfs target when many files are dirty
        self.offset = offset
        self.registry = registry  # a checkpoint's queue registry to write, if it changed

    def sync(self, fs: FileSystem) -> int:
        """Run in any thread; closes the descriptors whatever happens."""
        try:
            for fd in self.fds:
                fs.fsync(fd)
        finally:
            for fd in self.fds:
                os.close(fd)
        if (
            len(self.paths) > _SYNCFS_ABOVE_FILES
            and self.root is not None
            and fs.sync_filesystem(self.root)
        ):
            return self.offset
        for path in self.paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # deleted since (queue deleted, retention): nothing left to sync
            try:
                fs.fsync(fd)
            finally:
                os.close(fd)
        return self.offset


class LogStore:
    def __init__(self, config: StoreConfig, fs: FileSystem, clock: Clock) -> None:
        self.config = config
        self.fs = fs
        self.clock = clock
        root = config.data_dir
        self.commit_log = CommitLog(
            fs, root / "commitlog", config.segment_size_bytes, config.max_record_bytes
        )
        # State writes a full disk refused (logged once, retried by housekeeping).
        self.deferred = DeferredWrites()
        self.registry = QueueRegistry(fs, root / "queues.json", self.deferred)
        self.offsets = ConsumerOffsets(fs, root / "offsets.json", self.deferred)
        self.checkpoint_path = root / "checkpoint.json"
        self.cqs: dict[tuple[int, int], ConsumeQueue] = {}
        # (queue, partition) a record flagged CLOSES reached: the registry's ``closed`` lists,
        # kept in step with them (mark_closed). The broker refuses appends to these.
        self.closed: set[tuple[int, int]] = set()
        self.durable_offset = 0
        self.checkpointed_offset = 0  # the dispatched offset of the last checkpoint written
        # Appends of transient messages may hold index entries in memory (ConsumeQueue.
        # write_behind); the embedded store turns it on, as its checkpoints write them.
        self.index_write_behind = False
        self.recovery: RecoveryReport | None = None
        # Set while recovery's index entries wait for space (recovery.finish_recovery).
        self.pending_index: PendingIndex | None = None
        # The head segment a garbage collection is relocating records out of (see
        # storage/log/collector.py): not deleted until its entries are durably re-pointed.
        self.gc_hold: int | None = None
        # Whether the last run ended with close(); if not, per (queue, partition) the index
        # length found at open: anything below may have been delivered before the crash.
        self.clean_start = False
        self.unclean_marks: dict[tuple[int, int], int] = {}
        # Per (queue, partition): the index length found at open. What lies below was stored
        # by an earlier run: a transient message there is gone, as in RabbitMQ after a restart.
        self.restart_marks: dict[tuple[int, int], int] = {}
        self.collected = CollectorStats()
        self.gc_seen_starts: dict[tuple[int, int], int] = {}  # read starts at the last look
        self.shared_reads = SharedReads()  # large records held by readers (fan-out)
        self._lock_fd = -1
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        config: StoreConfig,
        fs: FileSystem | None = None,
        clock: Clock | None = None,
        held_lock_fd: int | None = None,
    ) -> LogStore:
        """Open (creating if needed) and recover. Raises CorruptionError for mid-log damage.

        ``held_lock_fd``: the LOCK file's descriptor, already flock'd by the caller (`mqgw
        storage repair` holds it across its whole run); used as is and left open at close.
        """
        store = cls(config, fs or FileSystem(), clock or wall_clock_ms)
        if held_lock_fd is None:
            store._lock()
        try:
            store._check_layout()
            store.registry.load()
            store._check_file_limit()
            store.offsets.load()
            store.commit_log.load()
            for info in store.registry.queues.values():
                store._open_queue(info)
            replay_journal(store)
            store.recovery = recover(store, Checkpoint.load(store.checkpoint_path))
            store._note_shutdown_kind()
        except BaseException:
            store._release()
            raise
        return store

    def _note_shutdown_kind(self) -> None:
        self.restart_marks = {key: cq.max_offset for key, cq in self.cqs.items() if cq.max_offset}
        marker = self.config.data_dir / _CLEAN_MARKER
        self.clean_start = marker.exists()
        if self.clean_start:
            # Durably gone before anything is delivered: a crash from now on is unclean.
            self.fs.unlink(marker)
            self.fs.fsync_dir(self.config.data_dir)
        else:
            self.unclean_marks = {key: cq.max_offset for key, cq in self.cqs.items()}

    def _check_file_limit(self) -> None:
        """Each queue partition keeps its newest index file open: make room, or warn."""
        needed = sum(info.partitions for info in self.registry.queues.values()) + 1024
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < needed:
            soft = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        if soft < needed:
            log.warning(
                "open file limit %d is below the %d this store needs (one per queue partition "
                "plus headroom): raise `ulimit -n`",
                soft,
                needed,
            )

    def _lock(self) -> None:
        root = self.config.data_dir
        root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(root / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self._lock_fd)
            raise StoreLocked(f"{root} is in use by another process") from exc

    def _check_layout(self) -> None:
        """Segment sizes are fixed for a store's life: opening with others would misread it."""
        layout = {
            "segment_size_bytes": self.config.segment_size_bytes,
            "cq_entries_per_segment": self.config.cq_entries_per_segment,
        }
        existing = read_layout(self.config.data_dir)
        if existing is None:
            write_new_layout(self.fs, self.config.data_dir, layout)
        elif existing != layout:
            raise StoreError(
                f"{self.config.data_dir} was created with {existing}; configured {layout}"
            )

    def _release(self) -> None:
        self.commit_log.close()
        for cq in self.cqs.values():
            cq.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # only set when open() took the lock itself
            self._lock_fd = -1
        self._closed = True

    def close(self) -> None:
        """Clean shutdown: everything fsynced, offsets and checkpoint written."""
        if self._closed:
            return
        try:
            self.begin_flush().sync(self.fs)
            self.durable_offset = self.commit_log.write_offset
            self.checkpoint()
            self.persist_offsets()
            marker = self.config.data_dir / _CLEAN_MARKER
            self.deferred.attempt(
                "clean shutdown marker", lambda: self.fs.write_atomic(marker, b"")
            )
        finally:
            self._release()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("the store is closed")

    # -- queues ------------------------------------------------------------------------------

    def _queue_dir(self, queue_id: int, partition: int) -> Path:
        return self.config.data_dir / "consumequeue" / str(queue_id) / str(partition)

    def _open_partition(self, queue_id: int, partition: int) -> ConsumeQueue:
        cq = ConsumeQueue(
            self.fs,
            self._queue_dir(queue_id, partition),
            queue_id,
            partition,
            self.config.cq_entries_per_segment,
        )
        cq.load()
        return cq

    def _open_queue(self, info: QueueInfo) -> None:
        for partition in range(info.partitions):
            self.cqs[(info.queue_id, partition)] = self._open_partition(info.queue_id, partition)
        self.closed.update((info.queue_id, p) for p in info.closed if p < info.partitions)

    def _new_partition(self, queue_id: int, partition: int) -> ConsumeQueue:
        """A partition being created, its first index file prepared."""
        cq = self._open_partition(queue_id, partition)
        try:
            # Its first index file now, not at its first message: with thousands of queues
            # the first round of publishes would otherwise pay a file creation each.
            cq.prepare()
        except BaseException:
            cq.close()
            raise
        return cq

    def create_queue(self, queue_id: int, partitions: int) -> None:
        """Ensures the queue exists with at least ``partitions`` partitions: creates it, or
        adds empty partitions after the existing ones to reach the count (their offsets start
        at 0); a queue with as many or more is left as it is. Partitions are never removed
        here. All or nothing: a failure (OSError) leaves the queue as it was."""
        self._check_open()
        if not 1 <= partitions <= 65535:
            raise ValueError("partitions must be in 1..65535")
        existing = self.registry.queues.get(queue_id)
        first = 0 if existing is None else existing.partitions
        if first >= partitions:
            return
        added: list[ConsumeQueue] = []
        try:
            for partition in range(first, partitions):
                added.append(self._new_partition(queue_id, partition))
        except BaseException:
            for cq in added:
                cq.close()
            raise
        offset = self.commit_log.write_offset
        if existing is None:
            self.registry.queues[queue_id] = QueueInfo(queue_id, partitions, offset)
        else:
            existing.grow(partitions, offset)
        for cq in added:
            self.cqs[(queue_id, cq.partition)] = cq
        # Saved before the next append (see append): declaring 10,000 queues costs one write,
        # and no record can reach a partition the registry on disk does not know.
        self.registry.dirty = True

    def delete_queue(self, queue_id: int) -> None:
        self._check_open()
        info = self.registry.queues.pop(queue_id, None)
        if info is None:
            raise UnknownQueue(queue_id)
        self.registry.dirty = True  # a queue resurrected by a crash is dropped as unknown
        for partition in range(info.partitions):
            self.cqs.pop((queue_id, partition)).delete()
            self.closed.discard((queue_id, partition))  # in place: the broker holds the set
        self.offsets.drop_queue(queue_id)

    def queues(self) -> dict[int, int]:
        return {q: info.partitions for q, info in self.registry.queues.items()}

    def mark_closed(self, key: tuple[int, int]) -> None:
        """A record flagged CLOSES reached ``key`` (an append, or recovery and a replica
        re-dispatching it: idempotent). Saved with the registry before the next append or by
        the next checkpoint; until then a recovery closes it again from the record."""
        if key in self.closed or key not in self.cqs:
            return
        self.closed.add(key)
        info = self.registry.queues[key[0]]
        info.closed = sorted({*info.closed, key[1]})
        self.registry.dirty = True

    def _cq(self, queue_id: int, partition: int) -> ConsumeQueue:
        cq = self.cqs.get((queue_id, partition))
        if cq is None:
            raise UnknownQueue(queue_id, partition)
        return cq

    # -- append ------------------------------------------------------------------------------

    def append(self, records: Sequence[Record]) -> AppendResult:
        """Write a batch (not yet durable: see begin_flush). All or nothing."""
        self._check_open()
        start = self.commit_log.write_offset
        if not records:
            return AppendResult(start, start, 0)
        if self.pending_index is not None:  # housekeeping writes them once space returns
            raise DiskFull("recovery's index entries wait for space; nothing appended")
        # Also when a checkpoint's snapshot of it is still being written by its thread.
        if self.registry.unsaved and not self.registry.save():
            raise DiskFull("no space left for the queue registry; nothing appended")
        store_ts = max(self.clock(), self.commit_log.last_store_ts_ms)
        offsets: list[int] = []
        first, runs = self.commit_log.append(records, store_ts, offsets)
        undo: list[tuple[ConsumeQueue, int, int]] = []
        starts: dict[tuple[int, int], int] = {}
        # Index entries may wait in memory only for transient messages: a persistent one's
        # are written (to the page cache) before it can be confirmed, so a kill, even on a
        # full disk where recovery could not rebuild them, leaves it readable.
        hold = self.index_write_behind and not any(r.flags & PERSISTENT for r in records)
        try:
            self._dispatch(runs, undo, starts, hold)
        except OSError as exc:
            # Backwards: a queue reached by several runs ends where its first one found it.
            for cq, max_offset, last_commit in reversed(undo):
                cq.roll_back(max_offset, last_commit)
            self.commit_log.truncate_from(start)
            raise StoreWriteError(f"consume queue write failed: {exc}", exc.errno) from exc
        for run in runs:  # closed only once the whole batch is in (usually one run)
            if run.closes:
                for destination in run.destinations:
                    self.mark_closed(destination)
        return AppendResult(
            first, self.commit_log.write_offset, len(records), tuple(offsets), starts, store_ts
        )

    def _dispatch(
        self,
        runs: list[DispatchRun],
        undo: list[tuple[ConsumeQueue, int, int]],
        starts: dict[tuple[int, int], int],
        defer: bool,
    ) -> None:
        cqs = self.cqs
        for destinations, entries, _ in runs:
            last_commit = CQ_ENTRY.unpack_from(entries, len(entries) - CQ_ENTRY_SIZE)[0]
            for destination in destinations:
                cq = cqs.get(destination)
                if cq is None:
                    continue  # queue deleted between routing and append: nothing to index
                undo.append((cq, cq.max_offset, cq.last_commit_offset))
                starts.setdefault(destination, cq.max_offset)
                cq.append(entries, last_commit, defer)

    # -- durability --------------------------------------------------------------------------

    def begin_flush(self) -> FlushTicket:
        """Prepare an fsync of everything written so far (call sync() in any thread)."""
        fds = [os.dup(segment.fd) for segment in self.commit_log.take_dirty()]
        return FlushTicket(fds, self.commit_log.write_offset)

    def flush(self) -> int:
        self.durable_offset = max(self.durable_offset, self.begin_flush().sync(self.fs))
        return self.durable_offset

    def begin_checkpoint(self) -> FlushTicket:
        """Consume-queue files to fsync before a checkpoint at the returned offset, and the
        queue registry if it changed: everything checkpoint() needs, taken here in the
        owner's thread, as checkpoint() may run in another one."""
        offset = self.commit_log.write_offset
        if not self.write_behind():
            offset = min(offset, self.checkpointed_offset)  # the indexes are not all written
        paths = [s.path for cq in self.cqs.values() for s in cq.take_dirty()]
        registry = self.registry.snapshot() if self.registry.dirty else None
        return FlushTicket([], offset, paths, self.config.data_dir, registry)

    def write_behind(self, cqs: Iterable[ConsumeQueue] | None = None) -> bool:
        """Write the index entries ``cqs`` (default: all) hold in memory; False if a write
        failed (what is left stays held, for a later try)."""
        for cq in self.cqs.values() if cqs is None else cqs:
            if not cq.unwritten:
                continue
            try:
                cq.write_behind()
            except OSError as exc:
                log.warning("index entries of queue %d not written yet: %s", cq.queue_id, exc)
                return False
        return True

    def checkpoint(self, ticket: FlushTicket | None = None) -> bool:
        """Record where recovery may start; the commitlog must be durable up to there.

        A full disk is no error here: the registry or checkpoint not written is logged once
        and written by a later call; the checkpoint on disk stays valid, only older. Returns
        whether a checkpoint was written. Without a ticket (the owner's thread) it first adds
        index entries recovery could not write for lack of space (finish_recovery)."""
        if ticket is None:
            finish_recovery(self, wait=False)
            ticket = self.begin_checkpoint()
        if ticket.registry is not None:
            self.registry.write(ticket.registry)
        dispatched = ticket.sync(self.fs)
        if self.pending_index is not None:
            return False  # indexes incomplete: the checkpoint must not move
        checkpoint = Checkpoint(min(dispatched, self.durable_offset))
        if not self.deferred.attempt(
            "checkpoint", lambda: checkpoint.save(self.fs, self.checkpoint_path)
        ):
            return False
        self.checkpointed_offset = checkpoint.dispatched
        return True

    def persist_offsets(self) -> None:
        if self.offsets.changed:
            self.offsets.changed = False
            self.offsets.write(self.offsets.snapshot())

    # -- read --------------------------------------------------------------------------------

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
        """Read the records behind ``entries`` with one pread per run of nearby records.

        Decoding is inlined in this loop on purpose: a call per message costs more than the
        decoding itself (see the store benchmark's catch-up figure).
        """
        messages: list[StoredMessage] = []
        append = messages.append
        make = tuple.__new__  # skips the NamedTuple's Python-level __new__ frame
        unpack_from = HEADER.unpack_from
        crc32 = zlib.crc32
        verify = self.config.verify_crc_on_read
        segment_size = self.config.segment_size_bytes
        min_commit = self.commit_log.min_offset
        shared = self.shared_reads
        i, n = 0, len(entries)
        while i < n:
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
            limit = len(buf)
            for k in range(i, j):
                commit, size, _ = entries[k]
                size &= ENTRY_SIZE_MASK
                pos = commit - base
                if pos + size > limit:
                    raise self._corrupt(commit, "record runs past the end of the commitlog")
                (
                    total,
                    magic,
                    crc,
                    physical,
                    born,
                    stored,
                    flags,
                    dests,
                    ex_len,
                    key_len,
                    p_len,
                    b_len,
                ) = unpack_from(buf, pos)
                if magic != MESSAGE_MAGIC or total != size or physical != commit:
                    if magic == COPY_MAGIC and total == size and physical == commit:
                        pass  # relocated by the garbage collector
                    elif magic == HOLE_MAGIC:
                        continue  # removed by repair; `storage check` listed it
                    else:
                        raise self._corrupt(commit, "consume queue entry does not match the record")
                if verify and crc32(buf[pos + 12 : pos + size]) != crc:
                    raise self._corrupt(commit, "crc mismatch")
                p = pos + HEADER_SIZE + dests * DEST_SIZE
                q = p + ex_len
                r = q + key_len
                t = r + p_len
                append(
                    make(
                        StoredMessage,
                        (
                            first_offset + k,
                            commit,
                            bytes(buf[p:q]),
                            bytes(buf[q:r]),
                            buf[r:t],
                            buf[t : t + b_len],
                            born,
                            stored,
                            flags,
                        ),
                    )
                )
            if large and messages and messages[-1].commit_offset == base:
                shared.put(base, SharedRecord(*messages[-1][2:]))
            i = j
        return messages

    def _corrupt(self, commit: int, reason: str) -> CorruptionError:
        segment_start = commit - commit % self.config.segment_size_bytes
        return CorruptionError(segment_name(segment_start), commit, reason)

    # -- offsets and counts ------------------------------------------------------------------

    def commit_offset(
        self,
        group: str,
        queue_id: int,
        partition: int,
        offset: int,
        fence: int = 0,
        progress: DeliveryProgress | None = None,
    ) -> None:
        """``fence``: the caller's fencing token (0: unfenced); StaleFence below the
        highest seen for the key, and nothing changes. ``progress``: kept in memory for
        queue_stats."""
        self._cq(queue_id, partition)
        key = (group, queue_id, partition)
        if fence:
            self.offsets.fence(key, fence)
        if progress is not None:
            _, end = self.partition_range(queue_id, partition)
            self.offsets.progress[key] = (*progress, max(0, end - progress[0]) + progress[1])
        if self.offsets.offsets.get(key) != offset:
            self.offsets.offsets[key] = offset
            self.offsets.changed = True

    def admit_fence(self, group: str, queue_id: int, partition: int, fence: int) -> None:
        """A call carrying ``fence`` (a read): StaleFence below the highest seen."""
        self.offsets.fence((group, queue_id, partition), fence)

    def committed_offset(self, group: str, queue_id: int, partition: int, fence: int = 0) -> int:
        """The committed offset, never below the partition's minimum. A ``fence`` is
        admitted (and registered) as for commit_offset: a new lease holder's first read."""
        low, _ = self.partition_range(queue_id, partition)
        if fence:
            self.offsets.fence((group, queue_id, partition), fence)
        return max(self.offsets.offsets.get((group, queue_id, partition), 0), low)

    def partition_range(self, queue_id: int, partition: int) -> tuple[int, int]:
        """(first readable offset after retention and purge, next offset to be written)."""
        cq = self._cq(queue_id, partition)
        floor = self.registry.queues[queue_id].floors[partition]
        return max(cq.min_offset, floor), cq.max_offset

    def queue_stats(self, queue_id: int, group: str = QUEUE_GROUP) -> QueueStats:
        info = self.registry.queues.get(queue_id)
        if info is None:
            raise UnknownQueue(queue_id)
        parts = []
        reports = self.offsets.progress
        for p in range(info.partitions):
            low, high = self.partition_range(queue_id, p)
            committed = self.committed_offset(group, queue_id, p)
            report = reports.get((group, queue_id, p), _NO_REPORT)
            fence = self.offsets.fences.get((group, queue_id, p), 0)
            parts.append(PartitionStats(p, low, high, committed, info.dropped[p], *report, fence))
        return QueueStats.of(queue_id, parts)

    def ready_count(self, queue_id: int, group: str = QUEUE_GROUP) -> int:
        return self.queue_stats(queue_id, group).ready

    def purge(self, queue_id: int, group: str = QUEUE_GROUP) -> int:
        """Make every stored message of the queue unreadable; returns how many were ready."""
        stats = self.queue_stats(queue_id, group)
        info = self.registry.queues[queue_id]
        info.floors = [s.max_offset for s in stats.partitions]
        self.registry.save()
        self.offsets.forget_progress(queue_id)  # what was ready is gone: reports start anew
        return stats.ready

    def offset_for_time(self, queue_id: int, partition: int, ts_ms: int) -> int:
        low, _ = self.partition_range(queue_id, partition)
        return max(low, self._cq(queue_id, partition).offset_for_time(ts_ms))

    # -- reclaim and retention -----------------------------------------------------------------

    def read_starts(self) -> dict[tuple[int, int], int]:
        """Per (queue, partition) that still has something to read: the lowest logical offset
        some group has not consumed (every group's committed offset counts: the queue's own,
        broadcast positions, the timer's levels; unacked deliveries lie past the committed
        offset, which is the lowest unacknowledged one)."""
        committed = self.offsets.reclaim_view()  # a crash must not need what we delete
        lowest: dict[tuple[int, int], int] = {}
        for (_group, queue_id, partition), offset in committed.items():
            key = (queue_id, partition)
            if key in self.cqs and offset < lowest.get(key, offset + 1):
                lowest[key] = offset
        starts: dict[tuple[int, int], int] = {}
        for key in self.cqs:
            low, high = self.partition_range(*key)
            # A partition its queue has not committed on is read from its start.
            own = committed.get((QUEUE_GROUP, *key), 0)
            start = max(low, min(lowest.get(key, own), own))
            if start < high:
                starts[key] = start
        return starts

    def pinned_offsets(self) -> dict[tuple[int, int], int]:
        """Per (queue, partition) with something to read: the lowest commitlog offset of a
        record it can still read (re-pointed entries may point further ahead than later
        ones; ConsumeQueue.lowest_commit accounts for them)."""
        pins: dict[tuple[int, int], int] = {}
        for key, start in self.read_starts().items():
            lowest = self.cqs[key].lowest_commit(start)
            if lowest is not None:
                pins[key] = lowest
        return pins

    def reclaim_boundary(self) -> int:
        """Every record below this offset has been consumed by everything that reads it, and
        is durable and checkpointed (so recovery never needs it)."""
        pins = self.pinned_offsets()
        bound = min(self.durable_offset, self.checkpointed_offset)
        if self.gc_hold is not None:
            bound = min(bound, self.gc_hold)
        return min(bound, *pins.values()) if pins else bound

    def seal_consumed_active(self) -> bool:
        """Seal the active segment early when it holds at least ``roll_consumed_bytes`` and
        nothing in it is still needed (or, with the collector on, what is needed can be
        copied out once it is sealed): a drained queue then frees the disk instead of
        leaving up to a segment (1 GiB) behind. True when sealed; the caller makes the
        filler durable and checkpoints before reclaim can delete the segment."""
        self._check_open()
        active = self.commit_log.files.last
        threshold = self.config.roll_consumed_bytes
        if active is None or threshold <= 0 or active.written < threshold:
            return False
        if self.pending_index is not None or self.gc_hold is not None:
            return False
        if active.start in self.commit_log.sealed_ts_ms:
            return False
        boundary = min(self.pinned_offsets().values(), default=self.commit_log.write_offset)
        drained = boundary >= self.commit_log.write_offset
        collectable = self.config.gc_max_live_ratio > 0 and boundary >= active.start
        if not (drained or collectable):
            return False
        try:
            self.commit_log.seal_active()
        except OSError as exc:  # a full disk: the filler is 28 bytes, try again later
            log.warning("could not seal the active commitlog segment: %s", exc)
            return False
        return True

    def apply_retention(self, now_ms: int | None = None) -> RetentionReport:
        """Delete the commitlog segments nothing can still read (older than
        ``min_retention_ms``), and, only where ``retention_ms`` is set, those past that age
        whether read or not (counted and logged per queue)."""
        self._check_open()
        now = self.clock() if now_ms is None else now_ms
        log_ = self.commit_log
        boundary = self.reclaim_boundary()
        deleted = freed = 0
        unread_deleted = False
        while len(log_.files.segments) > 1:
            first = log_.files.segments[0]
            age_ms = now - log_.sealed_ts_ms.get(first.start, 0)
            consumed = first.start + first.written <= boundary
            expired = self.config.retention_ms is not None and age_ms > self.config.retention_ms
            if not expired and not (consumed and age_ms >= self.config.min_retention_ms):
                break
            unread_deleted = unread_deleted or not consumed
            log_.remove_first_segment()
            freed += first.written
            deleted += 1
        dropped: dict[int, int] = {}
        if deleted and unread_deleted:
            dropped = self._forget_deleted(log_.min_offset)
        elif deleted:
            self._forget_consumed()
            log.info(
                "reclaimed %d commitlog segment(s), %d bytes; unread messages lost: %s",
                deleted,
                freed,
                dropped or "none",
            )
        return RetentionReport(deleted, freed, dropped)

    def _forget_consumed(self) -> None:
        """After deleting only consumed records: drop the index files wholly below each
        queue's read start (cheap: no entry is read; what lies below is never read)."""
        starts = self.read_starts()
        for key, cq in self.cqs.items():
            cq.drop_consumed_before(starts.get(key, cq.max_offset))

    def _forget_deleted(self, commit_min: int) -> dict[int, int]:
        dropped: dict[int, int] = {}
        for (queue_id, partition), cq in self.cqs.items():
            before = self.committed_offset(QUEUE_GROUP, queue_id, partition)
            cq.drop_before_commit_offset(commit_min)
            lost = max(0, min(cq.min_offset, cq.max_offset) - before)
            if lost:
                info = self.registry.queues[queue_id]
                info.dropped[partition] += lost
                dropped[queue_id] = dropped.get(queue_id, 0) + lost
        if dropped:
            self.registry.save()
        return dropped
