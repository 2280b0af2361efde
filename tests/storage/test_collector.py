"""Copy-forward collection: a head segment pinned by a few live records is freed by copying
them to the tail and re-pointing their entries; nothing readable is lost or duplicated, at any
crash point of a collection."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from storage import QUEUE_GROUP, LogStore
from storage.log.check import check_store
from storage.log.collector import (
    JOURNAL_NAME,
    apply_repoints,
    collect_now,
    plan_relocation,
    write_journal,
)
from storage.record import CQ_ENTRY, CQ_ENTRY_SIZE
from tests.storage.helpers import rec
from tests.storage.reading_model import FILL, ReadingModel, make_durable, small_config


def _stuck_and_busy(store: LogStore, rounds: int, collect: bool = True) -> None:
    """Queue 1 gets one message first and never consumes it; queue 2 is busy and keeps up;
    collection and reclaim run as housekeeping would."""
    store.create_queue(1, 1)
    store.create_queue(2, 1)
    store.append([rec(b"stuck" + FILL, (1, 0))])
    for i in range(rounds):
        store.append([rec(b"%05d" % i + FILL, (2, 0))])
        store.commit_offset(QUEUE_GROUP, 2, 0, i + 1)
        if collect and i % 10 == 9:
            make_durable(store)
            collect_now(store)
            make_durable(store)
            store.apply_retention()


def _bodies(store: LogStore, queue_id: int, start: int = 0) -> list[bytes]:
    return [bytes(m.body) for m in store.read(queue_id, 0, start, max_count=10_000).messages]


def test_one_stuck_message_no_longer_holds_the_log(tmp_path: Path) -> None:
    store = LogStore.open(small_config(tmp_path))
    _stuck_and_busy(store, 400)  # ~ 24 segments of traffic
    # Without collection every segment since the stuck message would still be on disk.
    assert len(store.commit_log.files.segments) <= 3
    assert store.collected.segments >= 20
    assert _bodies(store, 1) == [b"stuck" + FILL]
    stats = store.queue_stats(1)
    assert stats.ready == 1 and stats.dropped_by_retention == 0
    # The relocated record reads back with its original metadata, and survives a restart.
    message = store.read(1, 0, 0).messages[0]
    assert (message.exchange, message.routing_key, message.born_ts_ms) == (b"ex", b"rk", 7)
    assert bytes(message.properties) == b"\x90\x00\x02" and message.flags == 1
    store.close()
    assert check_store(small_config(tmp_path)).ok  # copies are valid records to the checker
    store = LogStore.open(small_config(tmp_path))
    assert _bodies(store, 1) == [b"stuck" + FILL]
    assert store.partition_range(1, 0) == (0, 1)  # recovery indexed no copy as a new message
    store.close()


def test_a_dense_head_goes_together_with_the_sparse_segments_behind_it(tmp_path: Path) -> None:
    """Copies of stuck messages end up dense at the head; alone it is too live to copy, so
    it is collected together with the consumed segments behind it (which it would pin)."""
    store = LogStore.open(small_config(tmp_path))
    store.create_queue(1, 1)
    store.create_queue(2, 1)
    for i in range(20):  # ~ 1.2 segments of stuck messages, nothing else
        store.append([rec(b"stuck%02d" % i + FILL, (1, 0))])
    busy = 0
    for _ in range(30):
        for _ in range(10):
            store.append([rec(b"busy" + FILL, (2, 0))])
            busy += 1
        store.commit_offset(QUEUE_GROUP, 2, 0, busy)
        make_durable(store)
        while collect_now(store) is not None:
            make_durable(store)
        store.apply_retention()
    live_segments = 2 + 1  # the stuck messages, plus the active segment
    assert len(store.commit_log.files.segments) <= live_segments + 1
    assert _bodies(store, 1) == [b"stuck%02d" % i + FILL for i in range(20)]


def test_a_segment_mostly_live_is_left_alone(tmp_path: Path) -> None:
    store = LogStore.open(small_config(tmp_path))
    store.create_queue(1, 1)
    for i in range(60):
        store.append([rec(b"%05d" % i + FILL, (1, 0))])
    make_durable(store)
    assert collect_now(store) is None  # every record live: copying would only add bytes
    assert store.commit_log.write_offset == store.durable_offset


def test_fanout_record_is_copied_once_and_every_queue_follows(tmp_path: Path) -> None:
    store = LogStore.open(small_config(tmp_path))
    for q in (1, 2, 3):
        store.create_queue(q, 1)
    store.append([rec(b"shared" + FILL, (1, 0), (2, 0))])
    for i in range(40):
        store.append([rec(b"%05d" % i + FILL, (3, 0))])
    store.commit_offset(QUEUE_GROUP, 3, 0, 40)
    make_durable(store)
    relocation = collect_now(store)
    assert relocation is not None and relocation.records == 1 and len(relocation.moves) == 2
    make_durable(store)
    store.apply_retention()
    assert store.commit_log.min_offset > 0
    assert _bodies(store, 1) == _bodies(store, 2) == [b"shared" + FILL]


def test_consumed_before_the_repoint_is_not_resurrected(tmp_path: Path) -> None:
    """A consumer that commits between the copy and the re-point: the copy is never read
    (the entry may still be re-pointed, but it lies below the committed offset)."""
    store = LogStore.open(small_config(tmp_path))
    _stuck_and_busy(store, 40, collect=False)
    store.append([rec(b"more" + FILL, (2, 0))])
    make_durable(store)
    relocation = plan_relocation(store, store.clock(), 0.5)
    assert relocation is not None
    store.commit_offset(QUEUE_GROUP, 1, 0, 1)
    store.flush()
    apply_repoints(store, relocation.moves)
    store.gc_hold = None
    make_durable(store)
    store.apply_retention()
    assert _bodies(store, 1, 1) == [] and store.queue_stats(1).ready == 0


def _entry(store: LogStore, queue_id: int, logical: int) -> tuple[int, int, int]:
    commit, size, ts = store.cqs[(queue_id, 0)].entry(logical)
    return commit, size, ts


def test_a_crash_after_the_journal_finishes_the_relocation_at_open(tmp_path: Path) -> None:
    config = small_config(tmp_path)
    store = LogStore.open(config)
    _stuck_and_busy(store, 40, collect=False)
    make_durable(store)
    old = _entry(store, 1, 0)
    relocation = plan_relocation(store, store.clock(), 0.5)
    assert relocation is not None
    store.flush()
    write_journal(store.fs, config.data_dir, relocation)
    # Crash before any entry was re-pointed, with a torn entry for good measure: the journal
    # rewrites it whole.
    cq = store.cqs[(1, 0)]
    cq.files.write(cq.files.segments[0], b"\xff" * 7, 0)
    store._release()  # a crash: no close, no checkpoint
    store = LogStore.open(config)
    assert not (config.data_dir / JOURNAL_NAME).exists()
    new = _entry(store, 1, 0)
    assert new[0] == relocation.moves[0].new_commit != old[0]
    assert _bodies(store, 1) == [b"stuck" + FILL]
    assert store.partition_range(1, 0) == (0, 1)
    make_durable(store)
    store.apply_retention()
    assert store.commit_log.min_offset > old[0]
    assert _bodies(store, 1) == [b"stuck" + FILL]
    store.close()


def test_a_crash_before_the_journal_leaves_only_unreferenced_copies(tmp_path: Path) -> None:
    config = small_config(tmp_path)
    store = LogStore.open(config)
    _stuck_and_busy(store, 40, collect=False)
    make_durable(store)
    old = _entry(store, 1, 0)
    assert plan_relocation(store, store.clock(), 0.5) is not None
    store.flush()
    store._release()
    store = LogStore.open(config)
    assert _entry(store, 1, 0) == old  # still the original; its segment is still there
    assert _bodies(store, 1) == [b"stuck" + FILL]
    assert store.partition_range(1, 0) == (0, 1) and store.partition_range(2, 0)[1] == 40
    # The next collection copies again and frees the head; the stray copy goes with its segment.
    assert collect_now(store) is not None
    store.close()


def test_relocated_entries_are_flagged_and_skipped_when_finding_the_last_dispatched(
    tmp_path: Path,
) -> None:
    """Recovery re-dispatches after a queue's last *dispatched* record: a relocated entry at
    the end of a queue points further ahead and must not hide records behind it."""
    config = small_config(tmp_path)
    store = LogStore.open(config)
    _stuck_and_busy(store, 40, collect=False)
    make_durable(store)
    assert collect_now(store) is not None
    assert _entry(store, 1, 0)[1] & (1 << 31)
    # A new message for queue 1, dispatched in memory but its index entry lost in a crash:
    store.append([rec(b"later" + FILL, (1, 0))])
    store.flush()
    cq = store.cqs[(1, 0)]
    cq.files.truncate(cq.files.last, (cq.max_offset - 1) * CQ_ENTRY_SIZE - cq.files.last.start)
    store._release()
    store = LogStore.open(config)
    assert _bodies(store, 1) == [b"stuck" + FILL, b"later" + FILL]
    store.close()


def test_space_amplification_stays_bounded_with_a_stuck_queue_beside_a_busy_one(
    tmp_path: Path,
) -> None:
    """Live bytes: the stuck queue's messages and the busy queue's steady backlog of 50."""
    store = LogStore.open(small_config(tmp_path))
    store.create_queue(1, 1)
    store.create_queue(2, 1)
    worst = 0.0
    stuck = 0
    for i in range(2000):
        if i % 100 == 0:
            store.append([rec(b"stuck%d" % i + FILL, (1, 0))])
            stuck += 1
        store.append([rec(b"%05d" % i + FILL, (2, 0))])
        store.commit_offset(QUEUE_GROUP, 2, 0, max(0, i + 1 - 50))
        if i % 10 == 9:
            make_durable(store)
            while collect_now(store) is not None:
                store.flush()
                store.checkpoint()
            store.apply_retention()
            live = (stuck + 50) * len(rec(b"00000" + FILL, (2, 0)).body)
            if i > 500:
                worst = max(worst, store.commit_log.files.total_bytes() / live)
    assert _bodies(store, 1) == [b"stuck%d" % i + FILL for i in range(0, 2000, 100)]
    # The bound a segment-granular log allows: live data plus up to two partly filled
    # segments (the active one and the one being collected).
    assert worst <= 2.0 + 2 * 4096 / ((stuck + 50) * 205)


@settings(max_examples=100, deadline=None)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(
                st.just("append"),
                st.integers(1, 30),
                st.sets(st.integers(0, 2), min_size=1, max_size=2),
            ),
            st.tuples(st.just("commit"), st.integers(0, 3), st.integers(0, 60)),
            st.tuples(st.just("collect"), st.just(0), st.just(frozenset())),
            st.tuples(st.just("crash_mid_collect"), st.integers(0, 2), st.just(frozenset())),
            st.tuples(st.just("restart"), st.just(0), st.just(frozenset())),
        ),
        min_size=10,
        max_size=40,
    )
)
def test_collection_never_loses_or_duplicates_what_a_group_can_read(
    steps: list[tuple[str, int, object]],
) -> None:
    root = Path(tempfile.mkdtemp())
    config = small_config(root, gc_max_live_ratio=0.9)  # collect often: that is what is tested
    store = LogStore.open(config)
    model = ReadingModel(store)
    for action, a, b in steps:
        if action == "append":
            assert isinstance(b, frozenset | set)
            model.append(store, a, b)
        elif action == "commit":
            model.commit(store, a, int(b))  # type: ignore[call-overload]
        elif action == "collect":
            make_durable(store)
            while collect_now(store) is not None:
                make_durable(store)
                store.apply_retention()
        elif action == "crash_mid_collect":
            make_durable(store)
            relocation = plan_relocation(store, store.clock(), 0.9)
            if relocation is not None:
                store.flush()
                if a >= 1:
                    write_journal(store.fs, config.data_dir, relocation)
                if a >= 2:
                    apply_repoints(store, relocation.moves[: len(relocation.moves) // 2])
            store._release()
            store = LogStore.open(config)
        else:
            make_durable(store)
            store.apply_retention()
            store.close()
            store = LogStore.open(config)
        model.check(store)
    store.close()
    shutil.rmtree(root)


def test_entry_layout_keeps_the_flag_out_of_the_size() -> None:
    packed = CQ_ENTRY.pack(123, 456 | (1 << 31), 789)
    commit, size, ts = CQ_ENTRY.unpack(packed)
    assert (commit, size & ((1 << 31) - 1), ts) == (123, 456, 789)
