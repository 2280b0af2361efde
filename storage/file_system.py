"""The file-system seam: every byte the store reads or writes goes through one of these.

Production binds the methods straight to ``os`` (no wrapper cost); tests substitute a layer
that fails writes with ENOSPC or EIO at a chosen moment, so disk-full behaviour is provable
without root or a real full disk.
"""

from __future__ import annotations

import os
from pathlib import Path


class FileSystem:
    """Thin, overridable access to positional file I/O."""

    def __init__(self) -> None:
        # Bound directly so the hot path pays nothing for the seam.
        self.pwrite = os.pwrite
        self.pread = os.pread
        self.fsync = os.fsync
        self.ftruncate = os.ftruncate
        self.close = os.close

    def open(self, path: Path, create: bool = True) -> int:
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        return os.open(path, flags, 0o644)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def unlink(self, path: Path) -> None:
        path.unlink(missing_ok=True)

    def write_atomic(self, path: Path, data: bytes) -> None:
        """Replace ``path`` with ``data`` so that a crash leaves the old or the new file whole."""
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[self.pwrite(fd, view, len(data) - len(view)) :]
            self.fsync(fd)
        finally:
            os.close(fd)
        tmp.replace(path)
        self.fsync_dir(path.parent)

    def fsync_dir(self, directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
