from __future__ import annotations

import pytest

from storage import DiskFull, LogStore, StoreConfig
from tests.storage.conftest import FaultyFileSystem
from tests.storage.helpers import bodies, rec


@pytest.mark.parametrize("space_left", [0, 1, 37, 150, 700, 3000])
def test_enospc_rolls_back_and_appends_resume_once_space_returns(
    small_config: StoreConfig, space_left: int
) -> None:
    fs = FaultyFileSystem()
    store = LogStore.open(small_config, fs)
    store.create_queue(1, 1)
    store.create_queue(2, 1)
    store.append([rec(b"before%d" % i, (1, 0), (2, 0)) for i in range(30)])
    end = store.commit_log.write_offset
    fs.space_bytes = space_left  # the disk fills part-way through the next batch
    with pytest.raises(DiskFull):
        store.append([rec(b"lost%d" % i + b"." * 90, (1, 0), (2, 0)) for i in range(40)])
    assert store.commit_log.write_offset == end
    for q in (1, 2):
        assert store.partition_range(q, 0) == (0, 30)
    fs.space_bytes = None  # space returns
    store.append([rec(b"after", (1, 0), (2, 0))])
    expected = [b"before%d" % i for i in range(30)] + [b"after"]
    assert bodies(store.read(1, 0, 0, 100).messages) == expected
    store.close()
    # After a restart no half record is visible and nothing of the failed batch came back.
    store = LogStore.open(small_config)
    for q in (1, 2):
        assert bodies(store.read(q, 0, 0, 100).messages) == expected
    store.close()


def test_enospc_without_restart_of_space_still_reopens_cleanly(small_config: StoreConfig) -> None:
    fs = FaultyFileSystem()
    store = LogStore.open(small_config, fs)
    store.create_queue(1, 1)
    store.append([rec(b"kept", (1, 0))])
    fs.space_bytes = 10
    with pytest.raises(DiskFull):
        store.append([rec(b"x" * 500, (1, 0))])
    # Simulate the process dying here (no close): release the lock by hand.
    store._release()
    store = LogStore.open(small_config)
    assert bodies(store.read(1, 0, 0).messages) == [b"kept"]
    assert store.recovery is not None and store.recovery.truncated_bytes == 0
    store.close()
