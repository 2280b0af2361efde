from __future__ import annotations

import dataclasses
import json

import pytest

from storage import (
    QUEUE_GROUP,
    LogStore,
    ReadStatus,
    RecordTooLarge,
    StoreConfig,
    StoreError,
    StoreLocked,
    UnknownQueue,
)
from tests.harness.clock import FakeClock
from tests.storage.helpers import bodies, rec


def test_append_and_read_back_every_field_across_segment_rollovers(
    small_config: StoreConfig,
) -> None:
    store = LogStore.open(small_config)
    store.create_queue(1, 1)
    for i in range(200):  # rolls over several segments
        store.append([rec(b"m%03d" % i, (1, 0), key=b"key%d" % i)])
    assert len(store.commit_log.files.segments) >= 4  # ~73 B records, 4 KiB segments
    result = store.read(1, 0, 0, max_count=1000)
    assert result.status is ReadStatus.FOUND
    assert bodies(result.messages) == [b"m%03d" % i for i in range(200)]
    m = result.messages[57]
    assert (m.queue_offset, m.exchange, m.routing_key) == (57, b"ex", b"key57")
    assert (bytes(m.properties), m.born_ts_ms, m.flags) == (b"\x90\x00\x02", 7, 1)
    assert result.next_offset == 200
    store.close()


def test_one_record_fans_out_to_every_destination(small_config: StoreConfig) -> None:
    store = LogStore.open(small_config)
    for q in (1, 2, 3):
        store.create_queue(q, 2)
    before = store.commit_log.write_offset
    store.append([rec(b"x", (1, 0), (2, 1), (3, 0))])
    written = store.commit_log.write_offset - before
    assert written < 100  # one body, not three copies
    for q, p in ((1, 0), (2, 1), (3, 0)):
        assert bodies(store.read(q, p, 0).messages) == [b"x"]
    assert store.read(1, 1, 0).status is ReadStatus.NO_NEW_MESSAGE
    assert store.read(2, 0, 0).messages == []
    store.close()


def test_read_outside_the_range_has_defined_answers(small_config: StoreConfig) -> None:
    store = LogStore.open(small_config)
    store.create_queue(1, 1)
    store.append([rec(b"%d" % i, (1, 0)) for i in range(10)])
    assert store.purge(1) == 10
    store.append([rec(b"new", (1, 0))])
    moved = store.read(1, 0, 3)
    assert moved.status is ReadStatus.MOVED
    assert bodies(moved.messages) == [b"new"]
    assert (moved.min_offset, moved.max_offset, moved.next_offset) == (10, 11, 11)
    over = store.read(1, 0, 50)
    assert (over.status, over.messages, over.next_offset) == (ReadStatus.OFFSET_OVERFLOW, [], 11)
    at_end = store.read(1, 0, 11)
    assert (at_end.status, at_end.next_offset) == (ReadStatus.NO_NEW_MESSAGE, 11)
    with pytest.raises(UnknownQueue):
        store.read(9, 0, 0)
    with pytest.raises(UnknownQueue):
        store.read(1, 1, 0)
    store.close()


def test_max_count_and_max_bytes_bound_a_read(small_config: StoreConfig) -> None:
    store = LogStore.open(small_config)
    store.create_queue(1, 1)
    store.append([rec(b"a" * 100, (1, 0)) for _ in range(20)])
    assert len(store.read(1, 0, 0, max_count=7).messages) == 7
    by_bytes = store.read(1, 0, 0, max_count=100, max_bytes=400)
    assert len(by_bytes.messages) == 2  # each record is ~180 bytes
    assert by_bytes.next_offset == 2
    one = store.read(1, 0, 0, max_count=100, max_bytes=1)
    assert len(one.messages) == 1  # always at least one, or a big message could never be read
    store.close()


def test_oversized_record_is_refused_before_anything_is_written(small_config: StoreConfig) -> None:
    store = LogStore.open(small_config)
    store.create_queue(1, 1)
    store.append([rec(b"ok", (1, 0))])
    end = store.commit_log.write_offset
    with pytest.raises(RecordTooLarge) as info:
        store.append([rec(b"fine", (1, 0)), rec(b"x" * 2000, (1, 0))])
    assert info.value.max_bytes == 1024
    assert store.commit_log.write_offset == end
    assert bodies(store.read(1, 0, 0, 10).messages) == [b"ok"]
    store.close()
    store = LogStore.open(small_config)
    assert bodies(store.read(1, 0, 0, 10).messages) == [b"ok"]
    store.close()


def test_purge_counts_only_ready_messages_and_survives_restart(small_config: StoreConfig) -> None:
    store = LogStore.open(small_config)
    store.create_queue(1, 2)
    store.append([rec(b"%d" % i, (1, i % 2)) for i in range(10)])
    store.commit_offset(QUEUE_GROUP, 1, 0, 3)  # 3 of partition 0's 5 consumed
    assert store.ready_count(1) == 7
    assert store.purge(1) == 7
    assert store.ready_count(1) == 0
    store.close()
    store = LogStore.open(small_config)
    assert store.ready_count(1) == 0
    assert store.read(1, 1, 0).messages == []
    store.close()


def test_offsets_persist_across_clean_restart(small_config: StoreConfig) -> None:
    store = LogStore.open(small_config)
    store.create_queue(4, 3)
    store.append([rec(b"x", (4, 2)) for _ in range(9)])
    store.commit_offset("g1", 4, 2, 6)
    store.close()
    store = LogStore.open(small_config)
    assert store.committed_offset("g1", 4, 2) == 6
    assert store.committed_offset("other", 4, 2) == 0
    assert store.queue_stats(4, "g1").ready == 3
    store.close()


def test_deleted_queue_id_never_sees_old_records_again(small_config: StoreConfig) -> None:
    store = LogStore.open(small_config)
    store.create_queue(1, 1)
    store.append([rec(b"old", (1, 0))])
    store.delete_queue(1)
    store.create_queue(1, 1)
    store.append([rec(b"new", (1, 0))])
    assert bodies(store.read(1, 0, 0).messages) == [b"new"]
    store.close()
    # Recovery re-dispatches from the log: the old record must not reappear.
    (small_config.data_dir / "checkpoint.json").unlink()
    store = LogStore.open(small_config)
    assert bodies(store.read(1, 0, 0).messages) == [b"new"]
    store.close()


def test_grown_partitions_never_see_records_from_before_they_existed(
    small_config: StoreConfig,
) -> None:
    """A record routed to a partition before create_queue added it is indexed nowhere, and
    stays so when recovery re-dispatches the log; records after the growth are found."""
    store = LogStore.open(small_config)
    store.create_queue(1, 2)
    store.append([rec(b"early", (1, 0), (1, 3)), rec(b"stray", (1, 2))])
    store.create_queue(1, 4)
    store.append([rec(b"late", (1, 2), (1, 3))])
    held = {0: [b"early"], 1: [], 2: [b"late"], 3: [b"late"]}
    assert {p: bodies(store.read(1, p, 0).messages) for p in range(4)} == held
    store.close()
    for other in (5, 6):  # the second time from a registry the reopened store wrote
        # Recovery re-dispatches the whole log into the new partitions' emptied indexes.
        (small_config.data_dir / "checkpoint.json").unlink()
        for p in (2, 3):
            for index_file in (small_config.data_dir / "consumequeue" / "1" / str(p)).iterdir():
                index_file.unlink()
        store = LogStore.open(small_config)
        assert store.queues()[1] == 4
        assert {p: bodies(store.read(1, p, 0).messages) for p in range(4)} == held
        assert store.recovery is not None and store.recovery.redispatched == 2
        store.create_queue(other, 1)  # the registry is written again at close
        store.close()


def test_registry_entries_name_when_partitions_were_added_once_grown(
    small_config: StoreConfig,
) -> None:
    store = LogStore.open(small_config)
    store.create_queue(1, 1)
    store.create_queue(2, 1)
    store.append([rec(b"x", (1, 0))])
    grown_at = store.commit_log.write_offset
    store.create_queue(2, 3)
    store.close()
    queues = json.loads((small_config.data_dir / "queues.json").read_bytes())["queues"]
    # A queue that never grew is written as before growth existed (older brokers read it).
    assert set(queues["1"]) == {"queue_id", "partitions", "created_at", "floors", "dropped"}
    assert queues["2"]["added_at"] == [0, grown_at, grown_at]
    assert (queues["2"]["floors"], queues["2"]["dropped"]) == ([0, 0, 0], [0, 0, 0])


def test_an_append_saves_the_registry_a_checkpoint_has_not_written_yet(
    small_config: StoreConfig,
) -> None:
    """A checkpoint takes the registry on the owner's thread and writes it on its own: an
    append meanwhile must not count on that write (a crash before it lost the partition)."""
    store = LogStore.open(small_config)
    store.create_queue(1, 1)
    store.append([rec(b"a", (1, 0))])
    store.create_queue(1, 2)
    ticket = store.begin_checkpoint()  # its thread has not written the registry yet
    assert ticket.registry is not None
    store.append([rec(b"b", (1, 1))])
    store.flush()
    store._release()  # a crash: the checkpoint never ran
    store = LogStore.open(small_config)
    assert store.queues() == {1: 2}
    assert bodies(store.read(1, 1, 0).messages) == [b"b"]
    store.close()


def test_offset_for_time_finds_the_first_message_at_or_after(small_config: StoreConfig) -> None:
    clock = FakeClock(1000)
    store = LogStore.open(small_config, clock=clock)
    store.create_queue(1, 1)
    for i in range(10):
        clock.now_ms = 1000 + i * 100
        store.append([rec(b"%d" % i, (1, 0))])
    assert store.offset_for_time(1, 0, 0) == 0
    assert store.offset_for_time(1, 0, 1450) == 5
    assert store.offset_for_time(1, 0, 1500) == 5
    assert store.offset_for_time(1, 0, 99999) == 10
    store.close()


def test_retention_by_age_deletes_segments_and_counts_unread_losses(
    small_config: StoreConfig,
) -> None:
    """Opt-in only (retention_ms is None by default: unread data is kept)."""
    small_config = dataclasses.replace(small_config, retention_ms=3_600_000)
    assert small_config.retention_ms is not None
    clock = FakeClock(1_000_000)
    store = LogStore.open(small_config, clock=clock)
    store.create_queue(1, 1)
    store.create_queue(2, 1)
    for i in range(60):
        store.append([rec(b"old%02d" % i + b"." * 60, (1, 0), (2, 0))])
    store.commit_offset(QUEUE_GROUP, 2, 0, 60)  # queue 2 read everything
    clock.now_ms += small_config.retention_ms + 1
    store.append([rec(b"fresh", (1, 0), (2, 0))])
    report = store.apply_retention()
    assert report.deleted_segments >= 1
    low, high = store.partition_range(1, 0)
    assert 0 < low < 60
    assert report.dropped_unread == {1: low}
    assert store.queue_stats(1).dropped_by_retention == low
    assert store.queue_stats(2).dropped_by_retention == 0
    moved = store.read(1, 0, 0, max_count=1000)
    assert moved.status is ReadStatus.MOVED
    assert moved.messages[0].queue_offset == low
    assert bodies(moved.messages)[-1] == b"fresh"
    assert high == 61
    store.close()
    store = LogStore.open(small_config, clock=clock)
    assert store.partition_range(1, 0) == (low, 61)
    assert store.queue_stats(1).dropped_by_retention == low
    store.close()


def test_a_disk_budget_never_deletes_unread_data(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Over the budget the gateway blocks publishers (disk alarm); the store keeps it all."""
    config = StoreConfig(
        tmp_path,
        segment_size_bytes=4096,
        cq_entries_per_segment=16,
        max_record_bytes=1024,
        disk_budget_bytes=3 * 4096,
    )
    store = LogStore.open(config)
    store.create_queue(1, 1)
    for i in range(300):
        store.append([rec(b"%04d" % i + b"." * 80, (1, 0))])
    store.flush()
    store.checkpoint()
    report = store.apply_retention()
    assert report.deleted_segments == 0
    assert store.commit_log.files.total_bytes() > 3 * 4096
    messages = store.read(1, 0, 0, max_count=1000).messages
    assert [bytes(m.body[:4]) for m in messages] == [b"%04d" % i for i in range(300)]
    store.close()


def test_a_store_directory_is_locked_and_its_layout_fixed(small_config: StoreConfig) -> None:
    store = LogStore.open(small_config)
    with pytest.raises(StoreLocked):
        LogStore.open(small_config)
    store.close()
    other = StoreConfig(small_config.data_dir, segment_size_bytes=8192, max_record_bytes=1024)
    with pytest.raises(StoreError, match="was created with"):
        LogStore.open(other)


def test_append_reports_what_it_assigned(small_config: StoreConfig) -> None:
    """Commit offsets per record and the first queue offset per destination: what a caught-up
    reader needs to take new messages from the batch instead of reading them back."""
    store = LogStore.open(small_config, clock=FakeClock(5000))
    store.create_queue(1, 2)
    store.create_queue(2, 1)
    store.append([rec(b"before", (1, 1))])
    # Enough records to roll over a 4 KiB segment in the middle of the batch.
    batch = [rec(b"m%02d" % i + b"." * 100, (1, 1), (2, 0)) for i in range(50)]
    result = store.append(batch)
    assert result.queue_starts == {(1, 1): 1, (2, 0): 0}
    assert result.store_ts_ms == 5000
    read = store.read(1, 1, 1, max_count=100).messages
    assert [m.commit_offset for m in read] == list(result.record_offsets)
    assert [bytes(m.body) for m in read] == [r.body for r in batch]
    store.close()
