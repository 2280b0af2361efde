"""The log store's durability: what is fsynced, from which thread, and what is then durable.

FlushTicket carries descriptors and paths out of the owner's thread to a worker that syncs
them; the Durability mixin of LogStore hands out those tickets (commitlog flushes, the index
files and registry a checkpoint needs), writes index entries held in memory, and persists
consumer offsets. LogStore.checkpoint, which also finishes recovery, uses them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from storage.log.consume_queue import ConsumeQueue
from storage.log.file_system import FileSystem
from storage.log.state_files import RegistrySnapshot
from storage.log.store_state import StoreState

log = logging.getLogger("mqgw.storage")

_SYNCFS_ABOVE_FILES = 64  # more dirty index files than this: one syncfs instead of fsyncs


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


class Durability(StoreState):
    """Flush and checkpoint tickets, index write-behind and offsets persistence."""

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

    def persist_offsets(self) -> None:
        if self.offsets.changed:
            self.offsets.changed = False
            self.offsets.write(self.offsets.snapshot())
