"""What a replicated broker must remember across a crash (docs/controller.md, rules 3, 5, 6, 12):
the boot count, the highest epoch it has seen, the last epoch it acted as master at, and its
epoch file: ``(epoch, start offset)`` for each master term whose entries its log holds.

One small JSON file next to the store, replaced atomically and fsynced before the broker acts
on what it records (an epoch seen, a term as master).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from storage.log.file_system import FileSystem

STATE_FILE = "replication.json"


@dataclass
class ReplicationState:
    path: Path
    fs: FileSystem
    boot: int = 0
    highest_epoch: int = 0
    master_epoch: int = 0  # the last epoch it acted as master at
    epochs: list[tuple[int, int]] = field(default_factory=list)  # (epoch, start), oldest first

    @classmethod
    def load(cls, data_dir: Path, fs: FileSystem) -> ReplicationState:
        path = data_dir / STATE_FILE
        state = cls(path, fs)
        if path.exists():
            data = json.loads(path.read_text())
            state.boot = int(data["boot"])
            state.highest_epoch = int(data["highest_epoch"])
            state.master_epoch = int(data["master_epoch"])
            state.epochs = [(int(e), int(s)) for e, s in data["epochs"]]
        return state

    def save(self) -> None:
        document = {
            "boot": self.boot,
            "highest_epoch": self.highest_epoch,
            "master_epoch": self.master_epoch,
            "epochs": [list(pair) for pair in self.epochs],
        }
        self.fs.write_atomic(self.path, json.dumps(document).encode())

    def log_epoch(self) -> int:
        """Epoch of the last entry (0: empty log or no term recorded)."""
        return self.epochs[-1][0] if self.epochs else 0

    def cut(self, end: int) -> bool:
        """Forget terms that start at or past ``end`` (the log was cut there); changed?"""
        kept = [(e, s) for e, s in self.epochs if s < end]
        changed = kept != self.epochs
        self.epochs = kept
        return changed

    def adopt(self, master_epochs: list[tuple[int, int]], end: int) -> bool:
        """A slave's log equals the master's up to ``end``: so do its terms. Changed?"""
        kept = [(e, s) for e, s in master_epochs if s < end]
        changed = kept != self.epochs
        self.epochs = kept
        return changed

    def begin_term(self, epoch: int, start: int) -> None:
        """Acting as master at ``epoch`` from ``start``: recorded before the first append."""
        self.master_epoch = epoch
        self.highest_epoch = max(self.highest_epoch, epoch)
        self.cut(start)
        if not self.epochs or self.epochs[-1][0] != epoch:
            self.epochs.append((epoch, start))
