"""LogStore: the synchronous core of the store (commitlog + consume queues + offsets).

Single-threaded by contract: one owner (the event loop of the embedded gateway, or a broker
process) calls it. Only fsync may run elsewhere: ``begin_flush``/``begin_checkpoint`` hand
out duplicated file descriptors that a worker thread syncs while appends go on.

The class is assembled from one mixin per job over the shared state (store_state.py): the
queue catalog (queue_catalog.py), the append path (appending.py), consumer positions
(positions.py), the read path (reading.py), reclaim and retention (retention.py) and
durability (durability.py). What stays here is the store's life: opening and recovering it,
closing it cleanly, and the checkpoint, which also finishes an interrupted recovery.
"""

from __future__ import annotations

import os

from storage.config import StoreConfig
from storage.log.appending import Appending
from storage.log.collector import replay_journal
from storage.log.durability import Durability, FlushTicket
from storage.log.file_system import FileSystem
from storage.log.opening import check_file_limit, check_layout, lock_data_dir
from storage.log.reading import Reading
from storage.log.recovery import finish_recovery, recover
from storage.log.retention import Retention
from storage.log.state_files import Checkpoint
from storage.log.store_state import Clock, wall_clock_ms

_CLEAN_MARKER = "CLEAN"  # written by close(), removed at open


class LogStore(Appending, Retention, Reading, Durability):
    """The log store; opened (and recovered) with LogStore.open."""

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
            store._lock_fd = lock_data_dir(store.config.data_dir)
        try:
            check_layout(store.fs, store.config)
            store.registry.load()
            check_file_limit(sum(info.partitions for info in store.registry.queues.values()))
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

    # -- checkpoint --------------------------------------------------------------------------

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
