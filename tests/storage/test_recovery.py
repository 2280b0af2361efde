from __future__ import annotations

import os
import shutil

import pytest

from storage import CorruptionError, LogStore, StoreConfig
from storage.log.check import check_store, config_for
from storage.log.repair import repair_store
from tests.storage.helpers import bodies, rec


def _fill(config: StoreConfig, count: int) -> list[int]:
    """Append ``count`` records one per batch; returns each record's commitlog offset."""
    store = LogStore.open(config)
    store.create_queue(1, 1)
    offsets = [store.append([rec(b"r%03d" % i, (1, 0))]).start_offset for i in range(count)]
    store.close()
    return offsets


def _crash_copy(config: StoreConfig) -> None:
    """Make the store look like a kill happened before any checkpoint: recovery starts at 0."""
    (config.data_dir / "checkpoint.json").unlink()


def _last_segment(config: StoreConfig) -> str:
    return sorted((config.data_dir / "commitlog").iterdir())[-1].as_posix()


def _all_bodies(config: StoreConfig) -> list[bytes]:
    store = LogStore.open(config)
    try:
        return bodies(store.read(1, 0, 0, max_count=10_000).messages)
    finally:
        store.close()


def test_garbage_tail_is_cut_and_the_store_opens(small_config: StoreConfig) -> None:
    _fill(small_config, 50)
    _crash_copy(small_config)
    with open(_last_segment(small_config), "ab") as f:
        f.write(os.urandom(300))
    assert _all_bodies(small_config) == [b"r%03d" % i for i in range(50)]
    store = LogStore.open(small_config)
    assert store.recovery is not None and store.recovery.truncated_bytes == 0  # cut last time
    store.close()


def test_truncated_last_record_is_dropped_and_appends_continue(small_config: StoreConfig) -> None:
    offsets = _fill(small_config, 50)
    _crash_copy(small_config)
    path = _last_segment(small_config)
    size = os.path.getsize(path)
    os.truncate(path, size - 5)  # half of the last record
    store = LogStore.open(small_config)
    assert store.recovery is not None
    assert store.recovery.truncated_bytes == size - 5 - (offsets[-1] % 4096)
    assert store.recovery.cq_entries_dropped == 1
    store.append([rec(b"after", (1, 0))])
    store.close()
    assert _all_bodies(small_config) == [b"r%03d" % i for i in range(49)] + [b"after"]


def test_missing_index_entries_are_rebuilt_from_the_commitlog(small_config: StoreConfig) -> None:
    _fill(small_config, 40)
    _crash_copy(small_config)
    shutil.rmtree(small_config.data_dir / "consumequeue" / "1" / "0")
    store = LogStore.open(small_config)
    assert store.recovery is not None and store.recovery.redispatched == 40
    store.close()
    assert _all_bodies(small_config) == [b"r%03d" % i for i in range(40)]


def _damage(config: StoreConfig, offset: int) -> None:
    start = offset - offset % config.segment_size_bytes
    path = config.data_dir / "commitlog" / f"{start:020d}"
    with open(path, "r+b") as f:
        f.seek(offset - start + 60)  # inside the record, after its header
        byte = f.read(1)
        f.seek(offset - start + 60)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_damaged_middle_record_is_reported_with_segment_and_offset(
    small_config: StoreConfig,
) -> None:
    offsets = _fill(small_config, 80)
    _crash_copy(small_config)
    bad = offsets[45]
    _damage(small_config, bad)
    with pytest.raises(CorruptionError) as info:
        LogStore.open(small_config)
    assert info.value.offset == bad
    assert info.value.segment == f"{bad - bad % 4096:020d}"
    assert "crc" in info.value.reason

    report = check_store(config_for(small_config.data_dir))
    assert [(p.offset, p.resume_at) for p in report.problems] == [(bad, offsets[46])]
    repaired = repair_store(config_for(small_config.data_dir))
    assert len(repaired.problems) == 1
    assert check_store(config_for(small_config.data_dir)).ok
    # Every record but the damaged one survives repair, in order.
    assert _all_bodies(small_config) == [b"r%03d" % i for i in range(80) if i != 45]


def test_damage_below_the_checkpoint_is_caught_on_read_not_served(
    small_config: StoreConfig,
) -> None:
    offsets = _fill(small_config, 30)
    _damage(small_config, offsets[10])
    store = LogStore.open(small_config)  # the checkpoint is past it: open is quick and trusts it
    with pytest.raises(CorruptionError) as info:
        store.read(1, 0, 0, max_count=100)
    assert info.value.offset == offsets[10]
    assert bodies(store.read(1, 0, 11, max_count=100).messages)[0] == b"r011"
    store.close()


def test_check_on_a_healthy_store_counts_every_record(small_config: StoreConfig) -> None:
    _fill(small_config, 120)
    report = check_store(config_for(small_config.data_dir))
    assert report.ok
    assert report.records == 120
    assert report.segments >= 3


def test_checkpoint_on_a_segment_boundary_after_a_crash_mid_rollover(
    small_config: StoreConfig,
) -> None:
    """A kill between sealing a segment and creating the next leaves a checkpoint exactly at
    the boundary, past the last file's bytes; reopening must treat it as the end, twice."""
    offsets = _fill(small_config, 60)
    segments = sorted((small_config.data_dir / "commitlog").iterdir())
    boundary = int(segments[-1].name)
    segments[-1].unlink()  # the crash happened before the new segment existed
    _crash_copy(small_config)
    kept = sum(1 for o in offsets if o < boundary)
    for _ in range(2):  # the first open checkpoints at the boundary, the second must accept it
        store = LogStore.open(small_config)
        assert store.commit_log.write_offset == boundary
        store.close()
    store = LogStore.open(small_config)
    store.append([rec(b"next", (1, 0))])
    assert store.commit_log.write_offset > boundary
    store.close()
    assert _all_bodies(small_config) == [b"r%03d" % i for i in range(kept)] + [b"next"]
