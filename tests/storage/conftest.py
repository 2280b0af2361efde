from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from storage import StoreConfig
from storage.log.file_system import FileSystem


class FaultyFileSystem(FileSystem):
    """Writes succeed until ``space_bytes`` run out, then fail with ENOSPC (after a short
    write, like a real full disk); fsync can be told to fail with EIO."""

    def __init__(self, space_bytes: int | None = None) -> None:
        super().__init__()
        self.space_bytes = space_bytes
        self.fail_fsync = False
        self.pwrite = self._pwrite
        self.fsync = self._fsync

    def _pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        if self.space_bytes is not None:
            if self.space_bytes <= 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            data = memoryview(data)[: self.space_bytes]
        n = os.pwrite(fd, data, offset)
        if self.space_bytes is not None:
            self.space_bytes -= n
        return n

    def _fsync(self, fd: int) -> None:
        if self.fail_fsync:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        os.fsync(fd)


@pytest.fixture
def small_config(tmp_path: Path) -> StoreConfig:
    return StoreConfig(
        tmp_path / "store",
        segment_size_bytes=4096,
        cq_entries_per_segment=16,
        max_record_bytes=1024,
    )
