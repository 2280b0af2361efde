"""The state every part of the log store shares, and the lookups each part starts from.

LogStore (log_store.py) is one single-owner object assembled from mixins, one per job: the
queue catalog, the append path, consumer positions, the read path, retention, durability.
This base holds what they all read and write (the commitlog, the consume queues, the queue
registry and offsets, the marks recovery and the collector leave) and the few lookups every
one of them uses: whether the store is still open, a partition's index, its readable range.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from storage.config import StoreConfig
from storage.errors import StoreClosed, UnknownQueue
from storage.log.collector import CollectorStats
from storage.log.commit_log import CommitLog
from storage.log.consume_queue import ConsumeQueue
from storage.log.file_system import FileSystem
from storage.log.recovery import PendingIndex
from storage.log.shared_reads import SharedReads
from storage.log.state_files import ConsumerOffsets, DeferredWrites, QueueRegistry
from storage.results import RecoveryReport

Clock = Callable[[], int]  # milliseconds since the epoch


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class StoreState:
    """The log store's state; see the module docstring for the parts built on it."""

    def __init__(self, config: StoreConfig, fs: FileSystem, clock: Clock) -> None:
        self.config = config
        self.fs = fs
        self.clock = clock
        root = config.data_dir
        self.commit_log = CommitLog(
            fs, root / "commitlog", config.segment_size_bytes, config.max_record_bytes
        )
        self.commit_log.recent.limit_bytes = config.recent_records_bytes
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

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("the store is closed")

    def _cq(self, queue_id: int, partition: int) -> ConsumeQueue:
        cq = self.cqs.get((queue_id, partition))
        if cq is None:
            raise UnknownQueue(queue_id, partition)
        return cq

    def partition_range(self, queue_id: int, partition: int) -> tuple[int, int]:
        """(first readable offset after retention and purge, next offset to be written)."""
        cq = self._cq(queue_id, partition)
        floor = self.registry.queues[queue_id].floors[partition]
        return max(cq.min_offset, floor), cq.max_offset
