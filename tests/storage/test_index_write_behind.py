"""Index write-behind (storage/log/consume_queue.py): entries an append holds in memory are read
as if written, written by the checkpoint (which never covers what it could not write),
rolled back with a failed append, and rebuilt by recovery after a crash."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from storage import LogStore, StoreConfig, StoreWriteError
from storage.log import consume_queue as consume_queue_module
from storage.log.file_system import FileSystem
from storage.record import CQ_ENTRY_SIZE, PERSISTENT, Record
from tests.storage.helpers import bodies
from tests.storage.helpers import rec as persistent_rec


class IndexFaults(FileSystem):
    """Index (consume queue) writes fail with ENOSPC while ``fail_index`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.index_fds: set[int] = set()
        self.fail_index = False
        self.pwrite = self._pwrite

    def open(self, path: Path, create: bool = True) -> int:
        fd = super().open(path, create)
        if "consumequeue" in path.parts:
            self.index_fds.add(fd)
        return fd

    def _pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        if self.fail_index and fd in self.index_fds:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.pwrite(fd, data, offset)


def _index_bytes(config: StoreConfig, queue_id: int) -> int:
    directory = config.data_dir / "consumequeue" / str(queue_id) / "0"
    return sum(path.stat().st_size for path in directory.iterdir())


def _checkpoint(config: StoreConfig) -> int:
    return int(json.loads((config.data_dir / "checkpoint.json").read_bytes())["dispatched"])


def _store(config: StoreConfig, fs: FileSystem | None = None) -> LogStore:
    store = LogStore.open(config, fs)
    store.index_write_behind = True
    return store


def rec(body: bytes, *dests: tuple[int, int]) -> Record:
    """A transient message: the kind whose index entries may wait in memory."""
    return persistent_rec(body, *dests)._replace(flags=0)


EXPECTED = [b"m%03d" % i for i in range(40)]


def test_held_entries_are_read_and_the_checkpoint_writes_them(small_config: StoreConfig) -> None:
    store = _store(small_config)
    store.create_queue(1, 1)
    store.create_queue(2, 1)
    for body in EXPECTED:  # 40 entries over three 16-entry index files
        store.append([rec(body, (1, 0), (2, 0))])
    assert _index_bytes(small_config, 1) < len(EXPECTED) * CQ_ENTRY_SIZE  # held, not written
    assert store.partition_range(1, 0) == (0, 40)
    assert bodies(store.read(1, 0, 0, 100).messages) == EXPECTED
    assert bodies(store.read(2, 0, 33, 100).messages) == EXPECTED[33:]
    assert store.offset_for_time(1, 0, 0) == 0
    store.flush()
    assert store.checkpoint()
    assert _checkpoint(small_config) == store.commit_log.write_offset
    for queue_id in (1, 2):
        assert _index_bytes(small_config, queue_id) == len(EXPECTED) * CQ_ENTRY_SIZE
    store.close()
    store = _store(small_config)
    assert bodies(store.read(2, 0, 0, 100).messages) == EXPECTED
    store.close()


def test_a_crash_loses_only_entries_recovery_rebuilds(small_config: StoreConfig) -> None:
    store = _store(small_config)
    store.create_queue(1, 1)
    store.append([rec(b"first", (1, 0))])
    store.flush()
    assert store.checkpoint()
    for body in EXPECTED:
        store.append([rec(body, (1, 0))])
    store.flush()
    store._release()  # the process dies: what the indexes held in memory is gone
    store = _store(small_config)
    assert store.recovery is not None and store.recovery.redispatched > 0
    assert bodies(store.read(1, 0, 0, 100).messages) == [b"first", *EXPECTED]
    store.close()


def test_a_failed_index_write_undoes_only_its_own_append(
    small_config: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consume_queue_module, "WRITE_BEHIND_BYTES", 5 * CQ_ENTRY_SIZE)
    fs = IndexFaults()
    store = _store(small_config, fs)
    store.create_queue(1, 1)
    for body in EXPECTED[:3]:
        store.append([rec(body, (1, 0))])  # held in memory
    end = store.commit_log.write_offset
    fs.fail_index = True
    with pytest.raises(StoreWriteError):  # the held tail and this batch go out together
        store.append([rec(body, (1, 0)) for body in EXPECTED[3:6]])
    assert store.commit_log.write_offset == end
    assert store.partition_range(1, 0) == (0, 3)
    assert bodies(store.read(1, 0, 0, 100).messages) == EXPECTED[:3]
    fs.fail_index = False
    store.append([rec(EXPECTED[6], (1, 0))])
    kept = [*EXPECTED[:3], EXPECTED[6]]
    assert bodies(store.read(1, 0, 0, 100).messages) == kept
    store.close()
    store = _store(small_config)
    assert bodies(store.read(1, 0, 0, 100).messages) == kept
    store.close()


def test_the_checkpoint_stays_back_while_held_entries_cannot_be_written(
    small_config: StoreConfig,
) -> None:
    fs = IndexFaults()
    store = _store(small_config, fs)
    store.create_queue(1, 1)
    store.append([rec(b"first", (1, 0))])
    store.flush()
    assert store.checkpoint()
    before = _checkpoint(small_config)
    for body in EXPECTED:
        store.append([rec(body, (1, 0))])
    store.flush()
    fs.fail_index = True
    store.checkpoint()
    assert _checkpoint(small_config) == before  # it would claim entries not in the files
    assert bodies(store.read(1, 0, 0, 100).messages) == [b"first", *EXPECTED]
    fs.fail_index = False
    assert store.checkpoint()
    assert _checkpoint(small_config) == store.commit_log.write_offset
    store._release()
    store = _store(small_config)
    assert bodies(store.read(1, 0, 0, 100).messages) == [b"first", *EXPECTED]
    store.close()


def test_a_queue_reached_by_several_runs_of_a_failed_append_ends_where_it_was(
    small_config: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consume_queue_module, "WRITE_BEHIND_BYTES", 5 * CQ_ENTRY_SIZE)
    fs = IndexFaults()
    store = _store(small_config, fs)
    store.create_queue(1, 1)
    store.create_queue(2, 1)
    for body in EXPECTED[:3]:
        store.append([rec(body, (1, 0))])  # queue 1 holds 3 entries
    fs.fail_index = True
    # Runs: queue 1, queue 2, queue 1 again; the last one reaches the limit and fails.
    batch = [rec(b"a", (1, 0)), rec(b"b", (2, 0)), rec(b"c", (1, 0))]
    with pytest.raises(StoreWriteError):
        store.append(batch)
    assert store.partition_range(1, 0) == (0, 3)
    assert store.partition_range(2, 0) == (0, 0)
    fs.fail_index = False
    store.append([rec(b"d", (1, 0))])
    assert bodies(store.read(1, 0, 0, 100).messages) == [*EXPECTED[:3], b"d"]
    store.close()


def test_a_persistent_message_never_waits_in_memory(small_config: StoreConfig) -> None:
    """Its entry goes to the file with its append, taking the transient ones held before it in
    that queue along: a kill, even on a full disk recovery could not rebuild on, keeps it."""
    store = _store(small_config)
    store.create_queue(1, 1)
    for body in EXPECTED[:5]:
        store.append([rec(body, (1, 0))])  # transient: held
    assert _index_bytes(small_config, 1) == 0
    store.append([persistent_rec(b"kept", (1, 0))])
    assert PERSISTENT & persistent_rec(b"", (1, 0)).flags
    assert _index_bytes(small_config, 1) == 6 * CQ_ENTRY_SIZE  # all six, in order
    assert bodies(store.read(1, 0, 0, 100).messages) == [*EXPECTED[:5], b"kept"]
    store.append([rec(b"after", (1, 0))])  # transient again: held
    assert _index_bytes(small_config, 1) == 6 * CQ_ENTRY_SIZE
    store.close()
