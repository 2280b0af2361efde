"""The store as the gateway uses it in-process: async, group-committed, with housekeeping.

The same coroutine API will later be served over the network by `mqgw broker` (the remote
client implements the same methods), so everything here takes and returns whole batches.

Flush policy:
- sync: an append writes to the page cache, then waits for an fsync that covers its end
  offset. Whoever finds no fsync running starts one (in a worker thread); everyone arriving
  meanwhile waits for it or the next, so many appends share one fsync (group commit).
- async: an append completes after the write; a housekeeping task fsyncs on an interval.
A failed fsync poisons the store: the page cache's state is unknown afterwards, so every later
append fails with StoreWriteError until the process restarts and recovery re-validates the log.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import anyio
from anyio.abc import TaskGroup

from storage.config import FlushPolicy, StoreConfig
from storage.errors import StoreWriteError
from storage.log import collector
from storage.log.file_system import FileSystem
from storage.log.log_store import LogStore
from storage.log.recovery import finish_recovery
from storage.log.store_state import Clock
from storage.record import Record
from storage.results import (
    QUEUE_GROUP,
    AppendResult,
    DeliveryProgress,
    QueueStats,
    ReadResult,
    RetentionReport,
)

log = logging.getLogger("mqgw.storage")

_WRITE_BEHIND_QUEUES = 256  # index tails written per event-loop turn before a checkpoint


class GroupCommitter:
    """Shares fsyncs between concurrent appends; counts them for the benchmark."""

    def __init__(self, store: LogStore) -> None:
        self._store = store
        self._running = False
        self._done = anyio.Event()
        self.failure: BaseException | None = None
        self.fsyncs = 0

    async def wait_durable(self, offset: int) -> None:
        store = self._store
        # Past the end nothing will ever be written to make it durable: wait for the end.
        offset = min(offset, store.commit_log.write_offset)
        while store.durable_offset < offset:
            if self.failure is not None:
                raise StoreWriteError(f"store failed an fsync earlier: {self.failure}")
            if self._running:
                await self._done.wait()
                continue
            await self.flush_now()

    async def flush_now(self) -> None:
        store = self._store
        self._running = True
        done = self._done
        try:
            ticket = store.begin_flush()
            durable = await anyio.to_thread.run_sync(ticket.sync, store.fs)
            store.durable_offset = max(store.durable_offset, durable)
            self.fsyncs += 1
        except OSError as exc:
            self.failure = exc
            log.error("commitlog fsync failed; the store refuses appends until restart: %s", exc)
            raise StoreWriteError(f"fsync failed: {exc}", exc.errno) from exc
        finally:
            self._running = False
            self._done = anyio.Event()
            done.set()


class EmbeddedStore:
    """Async facade over LogStore; construct with ``open_embedded_store``."""

    def __init__(self, store: LogStore) -> None:
        self.log = store
        # Index write-behind for transient messages only: entries held in memory at a kill
        # are rebuilt by recovery, which a full disk defers until space returns; a persistent
        # message's are written before it is confirmed (tests/compat/test_full_disk.py).
        store.index_write_behind = True
        self.config = store.config
        self.committer = GroupCommitter(store)
        self._sync = store.config.flush is FlushPolicy.SYNC
        self._checkpointing = anyio.Lock()

    async def append(self, records: Sequence[Record], wait_durable: bool = True) -> AppendResult:
        if self.committer.failure is not None:
            raise StoreWriteError(f"store failed an fsync earlier: {self.committer.failure}")
        result = self.log.append(records)
        if wait_durable:
            await self.wait_durable(result.end_offset)
        return result

    async def backlog_bytes(self) -> int:
        return self.log.commit_log.written_past(self.log.durable_offset)

    async def wait_durable(self, end_offset: int) -> None:
        if self._sync:
            await self.committer.wait_durable(end_offset)

    async def read(
        self,
        queue_id: int,
        partition: int,
        offset: int,
        max_count: int = 256,
        max_bytes: int = 4 << 20,
        wait_ms: int = 0,
        fence: int = 0,
    ) -> ReadResult:
        replaced = (0, 0)
        if fence:
            replaced = self.log.admit_fence(QUEUE_GROUP, queue_id, partition, fence)
        # ``wait_ms`` is the broker's business (storage/broker/server.py holds such reads): in one
        # process a publish wakes its queues directly, so this answers at once.
        # Reads are served from the page cache inline: a thread hop per batch costs more than
        # the pread it would move off the loop.
        result = self.log.read(queue_id, partition, offset, max_count, max_bytes)
        if replaced[0]:
            result = result._replace(replaced_fence=replaced[0], replaced_end=replaced[1])
        return result

    async def create_queue(self, queue_id: int, partitions: int) -> None:
        self.log.create_queue(queue_id, partitions)

    async def queues(self) -> dict[int, int]:
        return self.log.queues()

    async def delete_queue(self, queue_id: int) -> None:
        self.log.delete_queue(queue_id)

    async def purge(self, queue_id: int, group: str = QUEUE_GROUP) -> int:
        return self.log.purge(queue_id, group)

    async def queue_stats(self, queue_id: int, group: str = QUEUE_GROUP) -> QueueStats:
        return self.log.queue_stats(queue_id, group)

    async def commit_offset(
        self,
        group: str,
        queue_id: int,
        partition: int,
        offset: int,
        fence: int = 0,
        progress: DeliveryProgress | None = None,
    ) -> None:
        self.log.commit_offset(group, queue_id, partition, offset, fence, progress)

    async def committed_offset(
        self, group: str, queue_id: int, partition: int, fence: int = 0
    ) -> int:
        return self.log.committed_offset(group, queue_id, partition, fence)

    def set_append_limit(
        self, queue_id: int, max_length: int | None, max_length_bytes: int | None = None
    ) -> None:
        """In-process the gateway checks its own exact counts (one node sees every append);
        only a broker shared by several gateways enforces limits carried by appends."""

    async def unclean_marks(self, queue_id: int) -> dict[int, int]:
        return _of_queue(self.log.unclean_marks, queue_id)

    async def restart_marks(self, queue_id: int) -> dict[int, int]:
        return _of_queue(self.log.restart_marks, queue_id)

    async def offset_for_time(self, queue_id: int, partition: int, ts_ms: int) -> int:
        return self.log.offset_for_time(queue_id, partition, ts_ms)

    async def apply_retention(self) -> RetentionReport:
        if self.log.seal_consumed_active():
            # The filler must be durable and checkpointed before the segment may go.
            await self.committer.flush_now()
            await self.checkpoint()
        return self.log.apply_retention()

    async def disk_bytes(self) -> int:
        return self.log.commit_log.files.total_bytes()

    async def oldest_segment_ts(self) -> int | None:
        files = self.log.commit_log.files
        if len(files.segments) < 2:
            return None
        return self.log.commit_log.sealed_ts_ms.get(files.segments[0].start)

    async def held_back_bytes(self) -> dict[int, int]:
        log = self.log.commit_log
        end = log.write_offset
        held: dict[int, int] = {}
        for (queue_id, _partition), offset in self.log.pinned_offsets().items():
            start = offset - offset % log.segment_size
            held[queue_id] = max(held.get(queue_id, 0), end - max(start, log.min_offset))
        return held

    async def collect_garbage(self) -> int:
        """One copy-forward collection of the head segment (storage/log/collector.py); returns
        the bytes copied (0: nothing worth doing). Then reclaim deletes the segment."""
        store = self.log
        relocation = collector.plan_relocation(store, store.clock(), self.config.gc_max_live_ratio)
        if relocation is None:
            return 0
        root = self.config.data_dir
        try:
            await self.committer.wait_durable(relocation.copies_end)
            await anyio.to_thread.run_sync(collector.write_journal, store.fs, root, relocation)
        except BaseException:
            store.gc_hold = None  # nothing re-pointed: the copies are just unreferenced
            raise
        # From here a failure keeps the hold: the journal finishes the job at the next open.
        paths = collector.apply_repoints(store, relocation.moves)
        await anyio.to_thread.run_sync(collector.sync_files, store.fs, paths)
        await anyio.to_thread.run_sync(collector.retire_journal, store.fs, root)
        store.gc_hold = None
        store.collected.add(relocation)
        log.info(
            "garbage collector: moved %d live record(s), %d bytes, out of segment %d",
            relocation.records,
            relocation.copied_bytes,
            relocation.segment_start,
        )
        await self.apply_retention()
        return relocation.copied_bytes

    async def _collect_forever(self) -> None:
        """Collect segment after segment, pausing so that copying stays within
        ``gc_copy_rate_bytes`` per second; idle, look again every retention interval."""
        cfg = self.config
        while True:
            try:
                copied = await self.collect_garbage()
            except Exception:
                log.exception("garbage collector failed; trying again in a minute")
                await anyio.sleep(60)
                continue
            if copied:
                await anyio.sleep(copied / max(1, cfg.gc_copy_rate_bytes))
            else:
                await anyio.sleep(cfg.retention_check_interval_ms / 1000)

    # -- housekeeping ------------------------------------------------------------------------

    async def checkpoint(self) -> None:
        # One at a time (housekeeping and retention both ask for one): two worker threads
        # would write checkpoint.json through the same temporary file, and an older offset
        # could land after a newer one.
        async with self._checkpointing:
            # Everything written so far durable first (under sync flush too: appends nobody
            # waits on, such as transient messages', are flushed here).
            await self.committer.wait_durable(self.log.commit_log.write_offset)
            # Index entries recovery could not write on a full disk: here, on the loop
            # (appends write the indexes too). Until they are in, no checkpoint is written.
            finish_recovery(self.log)
            await self._write_behind()
            # Everything the worker thread needs is taken here, on the loop (the registry
            # included): the loop goes on changing the store while the thread writes.
            ticket = self.log.begin_checkpoint()
            await anyio.to_thread.run_sync(self.log.checkpoint, ticket)

    async def _write_behind(self) -> None:
        """Index entries held in memory go to their files a few hundred queues at a time,
        so that with 10,000 queues a checkpoint does not hold the loop for all the writes."""
        held = [cq for cq in self.log.cqs.values() if cq.unwritten]
        for start in range(0, len(held), _WRITE_BEHIND_QUEUES):
            if not self.log.write_behind(held[start : start + _WRITE_BEHIND_QUEUES]):
                return  # begin_checkpoint tries again, and holds the checkpoint back
            await anyio.lowlevel.checkpoint()

    async def persist_offsets(self) -> None:
        if self.log.offsets.changed:
            self.log.offsets.changed = False
            snapshot = self.log.offsets.snapshot()
            await anyio.to_thread.run_sync(self.log.offsets.write, snapshot)

    async def _every(self, interval_ms: int, job_name: str, job: object) -> None:
        assert callable(job)
        while True:
            await anyio.sleep(interval_ms / 1000)
            try:
                await job()
            except Exception:
                log.exception("store housekeeping job %s failed", job_name)

    def start_housekeeping(self, tg: TaskGroup) -> None:
        cfg = self.config
        if not self._sync:
            tg.start_soon(
                self._every, cfg.async_flush_interval_ms, "flush", self.committer.flush_now
            )
        tg.start_soon(self._every, cfg.checkpoint_interval_ms, "checkpoint", self.checkpoint)
        tg.start_soon(self._every, cfg.offset_persist_interval_ms, "offsets", self.persist_offsets)
        tg.start_soon(
            self._every, cfg.retention_check_interval_ms, "retention", self.apply_retention
        )
        if cfg.gc_max_live_ratio > 0:
            tg.start_soon(self._collect_forever)


def _of_queue(marks: dict[tuple[int, int], int], queue_id: int) -> dict[int, int]:
    return {p: n for (q, p), n in marks.items() if q == queue_id}


@asynccontextmanager
async def open_embedded_store(
    config: StoreConfig, fs: FileSystem | None = None, clock: Clock | None = None
) -> AsyncIterator[EmbeddedStore]:
    """Open, recover, run housekeeping; on exit flush everything and close cleanly."""
    store = await anyio.to_thread.run_sync(lambda: LogStore.open(config, fs, clock))
    embedded = EmbeddedStore(store)
    try:
        async with anyio.create_task_group() as tg:
            embedded.start_housekeeping(tg)
            try:
                yield embedded
            finally:
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(store.close)
