"""A full disk is a state, not a crash: the store opens and recovers on a disk that refuses
every write (the fault layer of conftest.py), keeps what it could not write in memory, logs it
once, and writes it once space returns. A crash meanwhile recovers from the older checkpoint.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from storage import QUEUE_GROUP, DiskFull, LogStore, StoreConfig, open_embedded_store
from storage.record import CQ_ENTRY_SIZE
from tests.storage.conftest import FaultyFileSystem
from tests.storage.helpers import bodies, rec

CHECKPOINT_LINE = "disk full: checkpoint not written, will retry"


def _checkpoint(config: StoreConfig) -> int:
    return int(json.loads((config.data_dir / "checkpoint.json").read_bytes())["dispatched"])


def _crash(store: LogStore) -> None:
    """The process dies: nothing more is written, the lock goes with it."""
    store._release()


def _filled_store(config: StoreConfig, count: int = 40) -> list[bytes]:
    """A store whose checkpoint is far behind its data, left as a crash leaves it."""
    store = LogStore.open(config)
    store.create_queue(1, 1)
    store.create_queue(2, 2)
    expected = [b"m%03d" % i for i in range(count)]
    for body in expected:
        store.append([rec(body, (1, 0), (2, 1))])
    store.flush()
    _crash(store)
    return expected


def _lose_index_tails(config: StoreConfig) -> None:
    """An OS crash lost the page cache of the indexes: most entries must be rebuilt."""
    for cq_dir in (config.data_dir / "consumequeue").glob("*/*"):
        for path in sorted(cq_dir.iterdir())[1:]:
            path.unlink()
        first = sorted(cq_dir.iterdir())[0]
        with first.open("r+b") as f:
            f.truncate(min(f.seek(0, 2), 3 * CQ_ENTRY_SIZE))


def _disk_full_lines(caplog: pytest.LogCaptureFixture, what: str) -> int:
    return sum(1 for r in caplog.records if r.getMessage().startswith(f"disk full: {what} not"))


def test_open_on_a_full_disk_recovers_and_writes_the_checkpoint_once_space_returns(
    small_config: StoreConfig, caplog: pytest.LogCaptureFixture
) -> None:
    expected = _filled_store(small_config)
    old = _checkpoint(small_config)
    fs = FaultyFileSystem(space_bytes=0)  # every write fails
    caplog.set_level(logging.INFO, "mqgw.storage")
    store = LogStore.open(small_config, fs)
    assert store.recovery is not None and store.recovery.scanned_from == old
    assert CHECKPOINT_LINE in caplog.text
    assert _checkpoint(small_config) == old  # the file on disk is whole, only older
    assert store.checkpointed_offset == old
    assert not list(small_config.data_dir.glob("*.tmp"))  # no half-written temp file left
    assert bodies(store.read(1, 0, 0, 100).messages) == expected  # consumers are served
    store.commit_offset(QUEUE_GROUP, 1, 0, 25)  # acks go on in memory
    store.persist_offsets()
    assert store.offsets.changed  # not written: persisted later
    assert store.checkpoint() is False  # housekeeping retries: still full, logged once
    assert _disk_full_lines(caplog, "checkpoint") == 1
    with pytest.raises(DiskFull):
        store.append([rec(b"refused", (1, 0))])
    assert store.commit_log.write_offset == store.durable_offset  # nothing half written

    fs.space_bytes = None  # space returns
    assert store.checkpoint() is True
    assert _checkpoint(small_config) == store.commit_log.write_offset
    assert "disk space is back: checkpoint written" in caplog.text
    store.persist_offsets()
    assert not store.offsets.changed
    store.append([rec(b"after", (1, 0))])
    store.close()
    store = LogStore.open(small_config)
    assert bodies(store.read(1, 0, 0, 100).messages) == [*expected, b"after"]
    assert store.committed_offset(QUEUE_GROUP, 1, 0) == 25
    store.close()


def test_a_torn_tail_cut_on_a_full_disk_stays_cut_without_the_new_checkpoint(
    small_config: StoreConfig,
) -> None:
    expected = _filled_store(small_config)
    segment = sorted((small_config.data_dir / "commitlog").iterdir())[-1]
    torn = b"\x00\x01torn record" * 5  # a write the crash interrupted
    with segment.open("ab") as f:
        f.write(torn)
    fs = FaultyFileSystem(space_bytes=0)
    store = LogStore.open(small_config, fs)
    assert store.recovery is not None and store.recovery.truncated_bytes == len(torn)
    _crash(store)  # the cut is on disk without any checkpoint
    store = LogStore.open(small_config, fs)
    assert store.recovery is not None and store.recovery.truncated_bytes == 0
    old = _checkpoint(small_config)
    assert store.checkpointed_offset == old < store.commit_log.write_offset
    fs.space_bytes = None  # space returns: appends go where the torn tail was
    store.append([rec(b"new%d" % i, (1, 0), (2, 1)) for i in range(3)])
    store.flush()
    _crash(store)  # before any checkpoint: the next recovery starts at the old one again
    assert _checkpoint(small_config) == old
    store = LogStore.open(small_config)
    assert store.recovery is not None
    assert store.recovery.truncated_bytes == 0 and store.recovery.scanned_from == old
    after = [*expected, b"new0", b"new1", b"new2"]
    assert bodies(store.read(1, 0, 0, 100).messages) == after
    assert bodies(store.read(2, 1, 0, 100).messages) == after
    store.close()


@pytest.mark.parametrize("space_left", [0, 30, 750, 1010])
def test_index_entries_recovery_cannot_write_wait_for_space_and_appends_wait_for_them(
    small_config: StoreConfig, space_left: int, caplog: pytest.LogCaptureFixture
) -> None:
    expected = _filled_store(small_config)
    _lose_index_tails(small_config)
    fs = FaultyFileSystem(space_bytes=space_left)  # the disk fills part-way through
    caplog.set_level(logging.INFO, "mqgw.storage")
    store = LogStore.open(small_config, fs)
    assert store.pending_index is not None
    assert "disk full: recovered index entries not written, will retry" in caplog.text
    served = bodies(store.read(1, 0, 0, 100).messages)
    assert served == expected[: len(served)]  # a prefix, never a gap
    for cq in store.cqs.values():  # only whole entries on disk
        assert sum(s.written for s in cq.files.segments) % CQ_ENTRY_SIZE == 0
    with pytest.raises(DiskFull):
        store.append([rec(b"refused", (1, 0))])
    assert store.checkpoint() is False

    fs.space_bytes = None
    assert store.checkpoint() is True  # finishes recovery first, then checkpoints
    assert store.pending_index is None
    for queue, partition in ((1, 0), (2, 1)):
        assert bodies(store.read(queue, partition, 0, 100).messages) == expected
    store.append([rec(b"after", (1, 0))])
    store.close()
    store = LogStore.open(small_config)
    assert bodies(store.read(1, 0, 0, 100).messages) == [*expected, b"after"]
    store.close()


@pytest.mark.anyio
async def test_housekeeping_adds_the_missing_index_entries_once_space_returns(
    small_config: StoreConfig,
) -> None:
    expected = _filled_store(small_config)
    _lose_index_tails(small_config)
    fs = FaultyFileSystem(space_bytes=0)
    config = replace(small_config, checkpoint_interval_ms=20)
    async with open_embedded_store(config, fs) as store:
        assert store.log.pending_index is not None
        with pytest.raises(DiskFull):
            await store.append([rec(b"refused", (1, 0))])
        fs.space_bytes = None
        with anyio.fail_after(10):  # the first retry waits a second (each one rescans)
            while store.log.pending_index is not None:
                await anyio.sleep(0.02)
        assert bodies((await store.read(2, 1, 0, 100)).messages) == expected
        await store.append([rec(b"after", (1, 0))])
    assert _checkpoint(small_config) == store.log.commit_log.write_offset


def test_a_crash_before_space_returns_recovers_the_indexes_again(
    small_config: StoreConfig,
) -> None:
    expected = _filled_store(small_config)
    cq_file = sorted((small_config.data_dir / "consumequeue" / "1" / "0").iterdir())[0]
    cq_file.write_bytes(b"")
    for path in sorted(cq_file.parent.iterdir())[1:]:
        path.unlink()
    store = LogStore.open(small_config, FaultyFileSystem(space_bytes=50))
    assert store.pending_index is not None
    _crash(store)
    store = LogStore.open(small_config)
    assert store.recovery is not None and store.pending_index is None
    assert bodies(store.read(1, 0, 0, 100).messages) == expected
    store.close()


def test_delete_and_purge_work_on_a_full_disk_and_are_written_later(
    small_config: StoreConfig, caplog: pytest.LogCaptureFixture
) -> None:
    expected = _filled_store(small_config)
    fs = FaultyFileSystem(space_bytes=0)
    store = LogStore.open(small_config, fs)
    assert store.purge(2) == len(expected)
    store.delete_queue(1)
    assert store.registry.dirty
    assert store.queue_stats(2).ready == 0
    store.close()  # a clean stop on a full disk: nothing raises, nothing half written
    assert _disk_full_lines(caplog, "queue registry") == 1
    store = LogStore.open(small_config)  # neither was written: both are forgotten
    assert set(store.queues()) == {1, 2} and store.queue_stats(2).ready == len(expected)
    _crash(store)
    fs = FaultyFileSystem(space_bytes=0)
    store = LogStore.open(small_config, fs)
    store.purge(2)
    store.delete_queue(1)
    fs.space_bytes = None
    assert store.checkpoint() is True  # housekeeping writes the registry too
    _crash(store)
    store = LogStore.open(small_config)
    assert set(store.queues()) == {2} and store.queue_stats(2).ready == 0
    store.close()


def test_a_new_store_on_a_full_disk_fails_clearly(tmp_path: Path) -> None:
    config = StoreConfig(tmp_path / "store", segment_size_bytes=4096, max_record_bytes=1024)
    with pytest.raises(DiskFull, match="cannot create a new store"):
        LogStore.open(config, FaultyFileSystem(space_bytes=0))
    LogStore.open(config).close()  # the lock was released, nothing half made
