"""The embedded node's metadata file: replaced atomically, and kept in memory (logged once)
while a full disk (ENOSPC, EDQUOT) refuses it, until a later write gets it on disk."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

log = logging.getLogger("mqgw.meta")

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def write_file_atomically(path: Path, payload: bytes) -> None:
    """Replace ``path`` with ``payload`` so that a crash leaves old or new, never half."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a half-written temp file would only hold space
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


class MetadataFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.deferred = False  # a full disk refused the last write

    def write(self, payload: bytes) -> bool:
        """Write the file (any thread); False, logged once, when the disk is full: the
        caller keeps the change in memory and writes again later."""
        try:
            write_file_atomically(self.path, payload)
        except OSError as error:
            if error.errno not in _DISK_FULL:
                raise
            if not self.deferred:
                self.deferred = True
                log.warning(
                    "disk full: metadata not written, kept in memory, will retry (%s)",
                    error.strerror,
                )
            return False
        if self.deferred:
            self.deferred = False
            log.info("disk space is back: metadata written")
        return True
