"""Small JSON state files, each replaced atomically: queue registry, offsets, checkpoint.

On a full disk (ENOSPC, EDQUOT) none of them is worth stopping the store for: the file on
disk stays whole (old contents), the new state stays in memory, the failure is logged once
and the next housekeeping pass writes it again (``DeferredWrites``).
"""

from __future__ import annotations

import errno
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from storage.errors import DiskFull, StaleFence
from storage.log.file_system import FileSystem

log = logging.getLogger("mqgw.storage")

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS


class DeferredWrites:
    """State writes a full disk refused: each logged once when it starts failing and once
    when it is written again. Any other OSError is raised as before."""

    def __init__(self) -> None:
        self.failing: set[str] = set()

    def attempt(self, what: str, write: Callable[[], None]) -> bool:
        """Run ``write``; False (logged once) when the disk is full."""
        try:
            write()
        except OSError as error:
            if not is_disk_full(error):
                raise
            if what not in self.failing:
                self.failing.add(what)
                log.warning("disk full: %s not written, will retry (%s)", what, error.strerror)
            return False
        if what in self.failing:
            self.failing.discard(what)
            log.info("disk space is back: %s written", what)
        return True


def write_new_layout(fs: FileSystem, data_dir: Path, layout: dict[str, int]) -> None:
    """``layout.json`` of a brand new store: the one write a store cannot open without."""
    try:
        fs.write_atomic(data_dir / "layout.json", json.dumps(layout).encode())
    except OSError as error:
        if not is_disk_full(error):
            raise
        message = f"cannot create a new store in {data_dir}: no space left"
        raise DiskFull(message, error.errno) from error


def _read_json(path: Path) -> Any:
    if not path.exists():
        return None
    with path.open("rb") as f:
        return json.loads(f.read())


def _write_json(fs: FileSystem, path: Path, value: Any) -> None:
    fs.write_atomic(path, json.dumps(value, separators=(",", ":"), sort_keys=True).encode())


@dataclass
class QueueInfo:
    """A queue id known to the store; ``created_at`` and ``added_at`` stop reuse of old
    records on recovery and on a replica."""

    queue_id: int
    partitions: int
    created_at: int  # commitlog offset at creation: earlier records never belong to it
    floors: list[int] = field(default_factory=list)  # per partition: purge moved min up to here
    dropped: list[int] = field(default_factory=list)  # per partition: lost unread to retention
    # Per partition: the commitlog offset it was added at (``created_at``, or where
    # create_queue grew the queue). A record stored earlier naming it (routed to a partition
    # that did not exist yet: indexed nowhere then) must not appear in it on re-dispatch.
    added_at: list[int] = field(default_factory=list)
    # Partitions a record flagged CLOSES reached (sorted): the broker refuses appends to them.
    closed: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.floors = self.floors or [0] * self.partitions
        self.dropped = self.dropped or [0] * self.partitions
        self.added_at = self.added_at or [self.created_at] * self.partitions

    def grow(self, partitions: int, offset: int) -> None:
        """Add partitions after the existing ones, up to ``partitions``, at commitlog
        ``offset``."""
        added = partitions - self.partitions
        self.floors += [0] * added
        self.dropped += [0] * added
        self.added_at += [offset] * added
        self.partitions = partitions

    def document(self) -> dict[str, Any]:
        """As the registry file holds it. ``added_at`` only once the queue has grown, and
        ``closed`` only once a partition is closed: the entry of a queue that did neither
        stays readable by brokers (and replicas) of versions without them."""
        # Field by field, not dataclasses.asdict (which deep-copies): a checkpoint after
        # thousands of declares writes them all, on the event loop.
        document: dict[str, Any] = {
            "queue_id": self.queue_id,
            "partitions": self.partitions,
            "created_at": self.created_at,
            "floors": self.floors,
            "dropped": self.dropped,
        }
        if any(at != self.created_at for at in self.added_at):
            document["added_at"] = self.added_at
        if self.closed:
            document["closed"] = self.closed
        return document


class RegistrySnapshot(NamedTuple):
    """The registry as JSON at one moment, numbered so that an older one never overwrites
    a newer one on disk."""

    version: int
    document: bytes


class QueueRegistry:
    """Queue id -> QueueInfo, changed by the store's owner (the event loop) only.

    A worker thread (the checkpoint) writes a snapshot the owner took: iterating the live
    dict there raced with declares ("dictionary changed size during iteration"). Writes
    from both sides go through one lock, newest version wins."""

    def __init__(self, fs: FileSystem, path: Path, deferred: DeferredWrites | None = None) -> None:
        self.fs = fs
        self.path = path
        self.deferred = deferred or DeferredWrites()
        self.queues: dict[int, QueueInfo] = {}
        self.dirty = False  # changed in memory, not yet on disk
        self._version = 0  # of the last snapshot taken
        self._written = 0  # version of what the file holds
        self._write_lock = threading.Lock()

    def load(self) -> None:
        data = _read_json(self.path) or {}
        self.queues = {int(k): QueueInfo(**v) for k, v in data.get("queues", {}).items()}

    @property
    def unsaved(self) -> bool:
        """Whether the file may lack something the memory holds: changed since the last
        snapshot, or a snapshot taken (a checkpoint's, written by a worker thread) is not
        written yet."""
        return self.dirty or self._written < self._version

    def document(self) -> bytes:
        """The registry as its file holds it (in the owner's thread); changes nothing."""
        queues = {str(k): v.document() for k, v in self.queues.items()}
        return json.dumps({"queues": queues}, separators=(",", ":"), sort_keys=True).encode()

    def snapshot(self) -> RegistrySnapshot:
        """The registry to write (in the owner's thread); it counts as written from now on,
        until a write of it fails."""
        self.dirty = False
        self._version += 1
        return RegistrySnapshot(self._version, self.document())

    def write(self, snapshot: RegistrySnapshot) -> bool:
        """Write ``snapshot`` (any thread) unless a newer one is on disk already. On a full
        disk: False, and the registry is dirty again (written by the next append or
        checkpoint); the file on disk keeps its older contents."""
        with self._write_lock:
            if snapshot.version <= self._written:
                return True
            if not self.deferred.attempt(
                "queue registry", lambda: self.fs.write_atomic(self.path, snapshot.document)
            ):
                self.dirty = True
                return False
            self._written = snapshot.version
            return True

    def save(self) -> bool:
        """Snapshot and write, in the owner's thread."""
        return self.write(self.snapshot())


OffsetKey = tuple[str, int, int]  # (group, queue id, partition)


class OffsetsSnapshot(NamedTuple):
    offsets: dict[OffsetKey, int]  # what the document holds (reclaim's view once written)
    document: bytes


class ConsumerOffsets:
    """Committed offsets per (group, queue id, partition); written only when changed."""

    def __init__(self, fs: FileSystem, path: Path, deferred: DeferredWrites | None = None) -> None:
        self.fs = fs
        self.path = path
        self.deferred = deferred or DeferredWrites()
        self.offsets: dict[OffsetKey, int] = {}
        # The highest fencing token seen per key (delivery leases: gateway/cluster/link.py);
        # written with the offsets, so a restarted broker still refuses a replaced holder.
        self.fences: dict[OffsetKey, int] = {}
        # What offsets.json holds: reclaim keeps what a restart would read again from it.
        self.persisted: dict[OffsetKey, int] = {}
        # The delivering gateway's last report per key (DeliveryProgress's fields and the
        # ready count it meant on arrival): memory only, as it is refreshed with every
        # commit; dropped when a new holder's fencing token arrives.
        self.progress: dict[OffsetKey, tuple[int, int, int, int]] = {}
        # Per key whose highest fence replaced another: (that fence, the partition's end
        # then), answered with every read under the fence (ReadResult.replaced_fence).
        # Memory only: after a restart a copy answers as if its fence had replaced none.
        self.replaced: dict[OffsetKey, tuple[int, int]] = {}
        self.changed = False

    def load(self) -> None:
        data = _read_json(self.path) or {}
        self.offsets = {}
        for group, queues in data.get("groups", {}).items():
            for key, offset in queues.items():
                queue_id, partition = key.split("/")
                self.offsets[(group, int(queue_id), int(partition))] = int(offset)
        self.fences = {}
        for group, queues in data.get("fences", {}).items():
            for key, fence in queues.items():
                queue_id, partition = key.split("/")
                self.fences[(group, int(queue_id), int(partition))] = int(fence)
        self.persisted = dict(self.offsets)

    def snapshot(self) -> OffsetsSnapshot:
        """The offsets to write, taken in the owner's thread (a writer thread must not
        iterate the live dict)."""
        taken = dict(self.offsets)
        groups: dict[str, dict[str, int]] = {}
        for (group, queue_id, partition), offset in taken.items():
            groups.setdefault(group, {})[f"{queue_id}/{partition}"] = offset
        doc: dict[str, Any] = {"groups": groups}
        if self.fences:  # absent until a cluster gateway fences: the file stays as it was
            fences: dict[str, dict[str, int]] = {}
            for (group, queue_id, partition), fence in self.fences.items():
                fences.setdefault(group, {})[f"{queue_id}/{partition}"] = fence
            doc["fences"] = fences
        document = json.dumps(doc, separators=(",", ":"), sort_keys=True)
        return OffsetsSnapshot(taken, document.encode())

    def write(self, snapshot: OffsetsSnapshot) -> bool:
        """Write a snapshot (any thread). On a full disk: False, and the offsets are marked
        changed so that the next persist writes them; reclaim keeps using the older file's."""
        if not self.deferred.attempt(
            "consumer offsets", lambda: self.fs.write_atomic(self.path, snapshot.document)
        ):
            self.changed = True
            return False
        self.persisted = snapshot.offsets
        return True

    def reclaim_view(self) -> dict[OffsetKey, int]:
        """Per live key the lower of its live and its persisted offset."""
        persisted = self.persisted
        return {k: min(v, persisted.get(k, v)) for k, v in self.offsets.items()}

    def drop_queue(self, queue_id: int) -> None:
        for key in [k for k in self.offsets if k[1] == queue_id]:
            del self.offsets[key]
        for key in [k for k in self.fences if k[1] == queue_id]:
            del self.fences[key]
            self.replaced.pop(key, None)
        self.forget_progress(queue_id)
        self.changed = True

    def forget_progress(self, queue_id: int) -> None:
        for key in [k for k in self.progress if k[1] == queue_id]:
            del self.progress[key]

    def fence(self, key: OffsetKey, fence: int, end: int = 0) -> None:
        """Admit a call carrying fencing token ``fence`` (0: unfenced, always admitted):
        StaleFence below the highest seen for ``key``; a higher one becomes the highest
        (``end``: the partition's end offset now, kept with the fence it replaced)."""
        seen = self.fences.get(key, 0)
        if fence < seen:
            group, queue_id, partition = key
            raise StaleFence(
                f"fencing token {fence} of queue {queue_id}/{partition} (group {group!r}) is "
                f"stale: token {seen} holds it now"
            )
        if fence > seen:
            self.fences[key] = fence
            if seen:
                self.replaced[key] = (seen, end)
            else:
                self.replaced.pop(key, None)
            self.progress.pop(key, None)  # the replaced holder's report no longer holds
            self.changed = True


@dataclass
class Checkpoint:
    """Recovery starts its scan at ``dispatched``: every consume-queue entry for records before
    it was fsynced, and the commitlog was durable up to it, when this was written."""

    dispatched: int = 0

    @classmethod
    def load(cls, path: Path) -> Checkpoint:
        data = _read_json(path)
        return cls(**data) if data else cls()

    def save(self, fs: FileSystem, path: Path) -> None:
        _write_json(fs, path, asdict(self))
