"""Small JSON state files, each replaced atomically: queue registry, offsets, checkpoint."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from storage.file_system import FileSystem


def _read_json(path: Path) -> Any:
    if not path.exists():
        return None
    with path.open("rb") as f:
        return json.loads(f.read())


def _write_json(fs: FileSystem, path: Path, value: Any) -> None:
    fs.write_atomic(path, json.dumps(value, separators=(",", ":"), sort_keys=True).encode())


@dataclass
class QueueInfo:
    """A queue id known to the store; ``created_at`` stops reuse of old records on recovery."""

    queue_id: int
    partitions: int
    created_at: int  # commitlog offset at creation: earlier records never belong to it
    floors: list[int] = field(default_factory=list)  # per partition: purge moved min up to here
    dropped: list[int] = field(default_factory=list)  # per partition: lost unread to retention

    def __post_init__(self) -> None:
        self.floors = self.floors or [0] * self.partitions
        self.dropped = self.dropped or [0] * self.partitions


class QueueRegistry:
    def __init__(self, fs: FileSystem, path: Path) -> None:
        self.fs = fs
        self.path = path
        self.queues: dict[int, QueueInfo] = {}
        self.dirty = False  # changed in memory, not yet on disk

    def load(self) -> None:
        data = _read_json(self.path) or {}
        self.queues = {int(k): QueueInfo(**v) for k, v in data.get("queues", {}).items()}

    def save(self) -> None:
        self.dirty = False
        _write_json(
            self.fs, self.path, {"queues": {str(k): asdict(v) for k, v in self.queues.items()}}
        )


OffsetKey = tuple[str, int, int]  # (group, queue id, partition)


class ConsumerOffsets:
    """Committed offsets per (group, queue id, partition); written only when changed."""

    def __init__(self, fs: FileSystem, path: Path) -> None:
        self.fs = fs
        self.path = path
        self.offsets: dict[OffsetKey, int] = {}
        # What offsets.json holds: reclaim keeps what a restart would read again from it.
        self.persisted: dict[OffsetKey, int] = {}
        self._snapshotted: dict[OffsetKey, int] = {}
        self.changed = False

    def load(self) -> None:
        data = _read_json(self.path) or {}
        self.offsets = {}
        for group, queues in data.get("groups", {}).items():
            for key, offset in queues.items():
                queue_id, partition = key.split("/")
                self.offsets[(group, int(queue_id), int(partition))] = int(offset)
        self.persisted = dict(self.offsets)

    def snapshot(self) -> bytes:
        self._snapshotted = dict(self.offsets)
        groups: dict[str, dict[str, int]] = {}
        for (group, queue_id, partition), offset in self.offsets.items():
            groups.setdefault(group, {})[f"{queue_id}/{partition}"] = offset
        return json.dumps({"groups": groups}, separators=(",", ":"), sort_keys=True).encode()

    def write(self, snapshot: bytes) -> None:
        taken = self._snapshotted
        self.fs.write_atomic(self.path, snapshot)
        self.persisted = taken

    def reclaim_view(self) -> dict[OffsetKey, int]:
        """Per live key the lower of its live and its persisted offset."""
        persisted = self.persisted
        return {k: min(v, persisted.get(k, v)) for k, v in self.offsets.items()}

    def drop_queue(self, queue_id: int) -> None:
        for key in [k for k in self.offsets if k[1] == queue_id]:
            del self.offsets[key]
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
