"""What opening a store directory checks before anything is read: its lock, its layout, the
open-file limit.

Pure functions over the directory and the configuration, called by LogStore.open (`mqgw
storage check` and the replay reader use read_layout without opening a store).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import resource
from pathlib import Path

from storage.config import StoreConfig
from storage.errors import StoreError, StoreLocked
from storage.log.file_system import FileSystem
from storage.log.state_files import write_new_layout

log = logging.getLogger("mqgw.storage")


def read_layout(data_dir: Path) -> dict[str, int] | None:
    path = data_dir / "layout.json"
    if not path.exists():
        return None
    layout: dict[str, int] = json.loads(path.read_bytes())
    return layout


def check_file_limit(partitions: int) -> None:
    """Each queue partition keeps its newest index file open: make room, or warn."""
    needed = partitions + 1024
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


def lock_data_dir(root: Path) -> int:
    """The flock'd descriptor of ``root``'s LOCK file (creating ``root`` if needed)."""
    root.mkdir(parents=True, exist_ok=True)
    lock_fd = os.open(root / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(lock_fd)
        raise StoreLocked(f"{root} is in use by another process") from exc
    return lock_fd


def check_layout(fs: FileSystem, config: StoreConfig) -> None:
    """Segment sizes are fixed for a store's life: opening with others would misread it."""
    layout = {
        "segment_size_bytes": config.segment_size_bytes,
        "cq_entries_per_segment": config.cq_entries_per_segment,
    }
    existing = read_layout(config.data_dir)
    if existing is None:
        write_new_layout(fs, config.data_dir, layout)
    elif existing != layout:
        raise StoreError(f"{config.data_dir} was created with {existing}; configured {layout}")
