"""The log store's append path: a batch into the commitlog, its entries into the indexes.

A mixin of LogStore. One commitlog record per message whatever its fan-out, one consume-queue
entry per destination; all or nothing (a failed index write rolls the indexes back and cuts
the commitlog where the batch began). Durability comes later (durability.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from storage.errors import DiskFull, StoreWriteError
from storage.log import index_dispatch
from storage.log.consume_queue import ConsumeQueue
from storage.log.queue_catalog import QueueCatalog
from storage.record import Record, any_persistent
from storage.results import AppendResult


class Appending(QueueCatalog):
    """The append path of LogStore."""

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
        hold = self.index_write_behind and not any_persistent(records)
        try:
            index_dispatch.picked(self.cqs, runs, undo, starts, hold)
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
