"""The file-system seam: every byte the store reads or writes goes through one of these.

Production binds the methods straight to ``os`` (no wrapper cost); tests substitute a layer
that fails writes with ENOSPC or EIO at a chosen moment, so disk-full behaviour is provable
without root or a real full disk.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_SYNCFS = getattr(_libc, "syncfs", None)  # Linux: flush one filesystem in one call


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
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[self.pwrite(fd, view, len(data) - len(view)) :]
                self.fsync(fd)
            finally:
                os.close(fd)
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a half-written temp file would only hold space
            raise
        self.fsync_dir(path.parent)

    def sync_filesystem(self, path: Path) -> bool:
        """Flush every dirty page of the filesystem holding ``path`` (Linux syncfs).

        One call instead of one fsync per file: a checkpoint of 10,000 queue files costs a
        syscall, not 10,000. Returns False where syncfs is missing (callers fsync per file).
        """
        if _SYNCFS is None:
            return False
        fd = os.open(path, os.O_RDONLY)
        try:
            if _SYNCFS(fd) != 0:
                errno = ctypes.get_errno()
                raise OSError(errno, os.strerror(errno))
        finally:
            os.close(fd)
        return True

    def fsync_dir(self, directory: Path) -> None:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
