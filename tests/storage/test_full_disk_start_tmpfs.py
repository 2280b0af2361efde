"""A full disk on a real small filesystem: a tmpfs mounted for the test (the tests run as root
here and in CI). Where mounting is refused the same scenarios run on a directory whose
capacity a fault layer enforces (``SmallDisk.fault_layer``, ``MQGW_TEST_FAKE_DISK=1`` forces
that), so nothing is ever skipped.

Covered here: the embedded store opens on a full disk and its housekeeping writes the
checkpoint and the consumer offsets once space returns; the metadata store keeps changes in
memory on a full disk (from its very first write on) and writes them on ``retry_write``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from meta import metadata_file
from meta.local_document import FILE_NAME
from meta.local_store import LocalMetadataStore
from meta.models import QueueDef, User
from meta.password import hash_password
from storage import QUEUE_GROUP, DiskFull, FlushPolicy, LogStore, StoreConfig, open_embedded_store
from storage.log.file_system import FileSystem
from tests.storage.helpers import rec

FORCE_FAULT_LAYER = os.environ.get("MQGW_TEST_FAKE_DISK") == "1"


def _enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class SmallDisk:
    """``size_bytes`` of disk at ``path``: a tmpfs when it can be mounted, otherwise a plain
    directory whose capacity only ``fault_layer`` (and the caller's patches) enforce."""

    def __init__(self, path: Path, size_bytes: int) -> None:
        self.path = path
        self.size_bytes = size_bytes
        self.mounted = False

    def __enter__(self) -> SmallDisk:
        self.path.mkdir(parents=True, exist_ok=True)
        if not FORCE_FAULT_LAYER:
            mount = ["mount", "-t", "tmpfs", "-o", f"size={self.size_bytes}", "tmpfs"]
            try:
                result = subprocess.run([*mount, str(self.path)], capture_output=True, check=False)
            except OSError:  # no mount(8) at all
                return self
            self.mounted = result.returncode == 0
        return self

    def __exit__(self, *exc: object) -> None:
        if self.mounted:
            if subprocess.run(["umount", str(self.path)], check=False).returncode:
                subprocess.run(["umount", "-l", str(self.path)], check=False)  # still busy
            self.mounted = False

    def used(self) -> int:
        if self.mounted:
            st = os.statvfs(self.path)
            return (st.f_blocks - st.f_bfree) * st.f_frsize
        total = 0
        for directory, _, files in os.walk(self.path):
            for name in files:
                try:
                    total += os.stat(os.path.join(directory, name)).st_size
                except FileNotFoundError:
                    continue
        return total

    def free(self) -> int:
        if self.mounted:
            st = os.statvfs(self.path)
            return st.f_bavail * st.f_frsize
        return max(0, self.size_bytes - self.used())

    def fill(self, name: str = "filler", leave_bytes: int = 0) -> Path:
        """Grow a file (appending) until ``leave_bytes`` are free; with 0 the disk is truly
        full afterwards: any write needing space fails."""
        path = self.path / name
        with path.open("ab", buffering=0) as f:
            chunk = 1 << 20
            while (todo := self.free() - leave_bytes) > 0:
                try:
                    f.write(b"\0" * min(todo, chunk))
                except OSError as error:
                    if error.errno != errno.ENOSPC:
                        raise
                    break
            while self.mounted and not leave_bytes and chunk:  # the last partial pages
                try:
                    if f.write(b"\0" * chunk) == chunk:
                        continue
                except OSError as error:
                    if error.errno != errno.ENOSPC:
                        raise
                chunk //= 2
        return path

    def fault_layer(self) -> FileSystem:
        """The store's file system: the real one on a tmpfs, else one that refuses writes
        past the capacity (short write, then ENOSPC, like a full disk)."""
        fs = FileSystem()
        if self.mounted:
            return fs
        real = fs.pwrite

        def pwrite(fd: int, data: bytes | memoryview, offset: int) -> int:
            room = max(0, os.fstat(fd).st_size - offset) + self.free()
            if room <= 0:
                raise _enospc()
            return real(fd, memoryview(data)[:room], offset)

        fs.pwrite = pwrite  # type: ignore[assignment]
        return fs

    def patch_metadata_writes(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without a tmpfs the metadata file's writes obey the capacity too."""
        if self.mounted:
            return
        real = metadata_file.write_file_atomically

        def write(path: Path, payload: bytes) -> None:
            if len(payload) > self.free():
                raise _enospc()
            real(path, payload)

        monkeypatch.setattr(metadata_file, "write_file_atomically", write)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    with SmallDisk(tmp_path / "disk", 8 << 20) as small_disk:
        yield small_disk


def _checkpoint(config: StoreConfig) -> int:
    return int(json.loads((config.data_dir / "checkpoint.json").read_bytes())["dispatched"])


def _committed(config: StoreConfig) -> dict[str, int]:
    path = config.data_dir / "offsets.json"
    if not path.exists():
        return {}
    offsets = json.loads(path.read_bytes())
    return dict(offsets["groups"].get(QUEUE_GROUP, {}))


@pytest.mark.anyio
async def test_the_embedded_store_starts_on_a_full_disk_and_catches_up_when_space_returns(
    disk: SmallDisk, caplog: pytest.LogCaptureFixture
) -> None:
    config = StoreConfig(
        disk.path / "store", segment_size_bytes=1 << 20, max_record_bytes=64 << 10,
        checkpoint_interval_ms=20, offset_persist_interval_ms=20,
    )  # fmt: skip
    fs = disk.fault_layer()
    store = LogStore.open(config, fs)
    store.create_queue(1, 1)
    stored = 0
    with pytest.raises(DiskFull):
        while True:  # until the disk refuses a batch (rolled back whole)
            store.append([rec(b"%06d" % stored + b"." * 30_000, (1, 0))])
            stored += 1
    store.flush()
    store._release()  # the process dies with the disk full
    filler = disk.fill()
    assert disk.free() == 0
    old = _checkpoint(config)

    caplog.set_level(logging.INFO, "mqgw.storage")
    config = replace(config, flush=FlushPolicy.ASYNC)
    async with open_embedded_store(config, fs) as embedded:
        assert "disk full: checkpoint not written, will retry" in caplog.text
        result = await embedded.read(1, 0, 0, stored + 10, max_bytes=1 << 30)
        assert [int(m.body[:6]) for m in result.messages] == list(range(stored))
        await embedded.commit_offset(QUEUE_GROUP, 1, 0, stored)  # every message consumed
        await anyio.sleep(0.2)  # a few housekeeping passes on the full disk: no crash
        assert _checkpoint(config) == old and _committed(config) == {}
        filler.unlink()  # space returns: housekeeping writes what waited, no restart
        with anyio.fail_after(10):
            while _checkpoint(config) == old or _committed(config) != {"1/0": stored}:
                await anyio.sleep(0.02)
    assert caplog.text.count("disk full: checkpoint not written") == 1  # logged once
    assert "disk space is back: consumer offsets written" in caplog.text


@pytest.mark.anyio
async def test_metadata_changes_on_a_full_disk_stay_in_memory_until_space_returns(
    disk: SmallDisk, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    disk.patch_metadata_writes(monkeypatch)
    filler = disk.fill()
    caplog.set_level(logging.INFO, "mqgw.meta")
    meta = LocalMetadataStore(disk.path / "meta")  # a first start: not even one file fits
    assert not (disk.path / "meta" / FILE_NAME).exists()
    user = User(name="app", password_hash=hash_password("s3cret"), tags=("management",))
    await meta.put_user(user)
    queue = await meta.declare_queue(QueueDef(vhost="/", name="orders", durable=True))
    await meta.retry_write()  # what the node's housekeeping calls: still full, no error
    assert caplog.text.count("disk full: metadata not written") == 1
    assert await meta.get_user("app") == user  # served from memory meanwhile

    filler.unlink()
    await meta.retry_write()
    assert "disk space is back: metadata written" in caplog.text
    reread = LocalMetadataStore(disk.path / "meta")
    assert await reread.get_user("app") == user
    assert await reread.get_queue("/", "orders") == queue

    disk.fill()  # full again: a delete works in memory and is written later
    await meta.delete_queue("/", "orders")
    assert await LocalMetadataStore(disk.path / "meta").get_queue("/", "orders") is not None
    (disk.path / "filler").unlink()
    await meta.retry_write()
    assert await LocalMetadataStore(disk.path / "meta").get_queue("/", "orders") is None
    assert not list((disk.path / "meta").glob("*.tmp"))
