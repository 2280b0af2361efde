"""Reclaim: a commitlog segment goes as soon as nothing can still read it (every group's
committed offset lies past its records), never before; age alone does not delete unread data
unless retention_ms is set; a crash right after a reclaim still finds what it needs."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import QUEUE_GROUP, LogStore, StoreConfig, open_embedded_store
from tests.harness.clock import FakeClock
from tests.storage.helpers import rec
from tests.storage.reading_model import FILL, ReadingModel, make_durable, small_config


def test_consumed_segments_go_and_a_slow_queue_keeps_what_it_has_not_read(
    tmp_path: Path,
) -> None:
    store = LogStore.open(small_config(tmp_path))
    store.create_queue(1, 1)  # busy, keeps up
    store.create_queue(2, 1)  # slow
    for i in range(100):
        store.append([rec(b"%03d" % i + FILL, (1, 0), (2, 0))])
    store.commit_offset(QUEUE_GROUP, 1, 0, 100)
    store.commit_offset(QUEUE_GROUP, 2, 0, 40)
    make_durable(store)
    segments_before = len(store.commit_log.files.segments)
    report = store.apply_retention()
    assert report.deleted_segments > 0 and report.dropped_unread == {}
    assert len(store.commit_log.files.segments) < segments_before
    assert store.commit_log.min_offset <= store.pinned_offsets()[(2, 0)]
    # Everything the slow queue has not consumed is still there, in order.
    unread = store.read(2, 0, 40, max_count=1000).messages
    assert [bytes(m.body[:3]) for m in unread] == [b"%03d" % i for i in range(40, 100)]

    store.commit_offset(QUEUE_GROUP, 2, 0, 100)
    make_durable(store)
    store.apply_retention()
    assert len(store.commit_log.files.segments) == 1  # only the active segment is left
    store.close()


def test_a_commit_not_yet_persisted_pins_nothing_a_restart_needs(tmp_path: Path) -> None:
    config = small_config(tmp_path)
    store = LogStore.open(config)
    store.create_queue(1, 1)
    for i in range(100):
        store.append([rec(b"%03d" % i + FILL, (1, 0))])
    store.commit_offset(QUEUE_GROUP, 1, 0, 20)
    make_durable(store)  # offsets.json says 20
    store.commit_offset(QUEUE_GROUP, 1, 0, 100)  # acked since, not yet persisted
    store.apply_retention()
    # A crash now restarts from offset 20: it must still be readable.
    assert store.commit_log.min_offset <= store.pinned_offsets()[(1, 0)]
    assert bytes(store.read(1, 0, 20, 1).messages[0].body[:3]) == b"020"
    store.persist_offsets()
    assert store.apply_retention().deleted_segments > 0
    assert len(store.commit_log.files.segments) == 1
    store.close()


def test_other_groups_pin_too_and_min_retention_keeps_consumed_segments(
    tmp_path: Path,
) -> None:
    clock = FakeClock(1_000_000)
    store = LogStore.open(small_config(tmp_path, min_retention_ms=60_000), clock=clock)
    store.create_queue(1, 1)
    for i in range(100):
        store.append([rec(b"%03d" % i + FILL, (1, 0))])
    store.commit_offset(QUEUE_GROUP, 1, 0, 100)
    store.commit_offset("broadcast:audit", 1, 0, 10)  # a broadcast position far behind
    make_durable(store)
    clock.now_ms += 120_000
    store.apply_retention()
    assert bytes(store.read(1, 0, 10, 5).messages[0].body[:3]) == b"010"
    store.commit_offset("broadcast:audit", 1, 0, 100)
    make_durable(store)
    clock.now_ms -= 119_000  # younger than min_retention: kept though consumed
    assert store.apply_retention().deleted_segments == 0
    clock.now_ms += 119_000
    assert store.apply_retention().deleted_segments > 0
    store.close()


def test_age_deletes_unread_data_only_when_retention_is_set(tmp_path: Path) -> None:
    clock = FakeClock(1_000_000)
    store = LogStore.open(small_config(tmp_path), clock=clock)
    store.create_queue(1, 1)
    for i in range(100):
        store.append([rec(b"%03d" % i + FILL, (1, 0))])
    make_durable(store)
    clock.now_ms += 365 * 24 * 3_600_000  # a year unread
    assert store.apply_retention().deleted_segments == 0
    assert len(store.read(1, 0, 0, 1000).messages) == 100
    store.close()


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(
                st.just("append"), st.integers(1, 30), st.sets(st.integers(0, 2), min_size=1)
            ),
            st.tuples(st.just("commit"), st.integers(0, 3), st.integers(0, 40)),
            st.tuples(st.just("reclaim"), st.just(0), st.just(frozenset())),
            st.tuples(st.just("restart"), st.just(0), st.just(frozenset())),
        ),
        max_size=25,
    )
)
def test_reclaim_never_deletes_what_a_group_can_still_read(
    steps: list[tuple[str, int, object]],
) -> None:
    root = Path(tempfile.mkdtemp())
    config = small_config(root)
    store = LogStore.open(config)
    model = ReadingModel(store)
    for action, a, b in steps:
        if action == "append":
            assert isinstance(b, frozenset | set)
            model.append(store, a, b)
        elif action == "commit":
            model.commit(store, a, int(b))  # type: ignore[call-overload]
        elif action == "reclaim":
            make_durable(store)
            store.apply_retention()
        else:
            make_durable(store)
            store.apply_retention()
            store.close()
            store = LogStore.open(config)
        model.check(store)
    store.close()
    shutil.rmtree(root)


def _sealing_config(tmp_path: Path) -> StoreConfig:
    """1 GiB segments, sealed early once 64 KiB of the active one is consumed."""
    return dataclasses.replace(
        small_config(tmp_path), segment_size_bytes=1 << 30, max_record_bytes=4096,
        roll_consumed_bytes=64 << 10, cq_entries_per_segment=1000,
    )  # fmt: skip


@pytest.mark.anyio
async def test_a_drained_active_segment_is_sealed_early_and_reclaimed(tmp_path: Path) -> None:
    """With 1 GiB segments a drained backlog would otherwise stay on disk in the active
    segment until it fills; sealed early, it goes as soon as its records are consumed."""
    config = _sealing_config(tmp_path)
    async with open_embedded_store(config) as store:
        await store.create_queue(1, 1)
        await store.create_queue(2, 1)
        for i in range(400):  # ~ 100 KiB
            await store.append([rec(b"%05d" % i + FILL, (1, 0))])
        await store.append([rec(b"late" + FILL, (2, 0))])
        await store.commit_offset(QUEUE_GROUP, 1, 0, 400)
        await store.persist_offsets()
        await store.checkpoint()
        # Queue 2 has not read its message: with the collector off, nothing is sealed.
        off = dataclasses.replace(config, gc_max_live_ratio=0.0)
        store.log.config = off
        assert (await store.apply_retention()).deleted_segments == 0
        assert store.log.commit_log.write_offset < 1 << 30
        await store.commit_offset(QUEUE_GROUP, 2, 0, 1)
        await store.persist_offsets()
        report = await store.apply_retention()
        assert report.deleted_segments == 1 and report.dropped_unread == {}
        assert await store.disk_bytes() == 0  # only the new, empty active segment is left
        await store.append([rec(b"after" + FILL, (2, 0))])
        got = await store.read(2, 0, 1)
        assert [bytes(m.body[:5]) for m in got.messages] == [b"after"]
    async with open_embedded_store(config) as store:  # and it reopens where it was
        assert [bytes(m.body[:5]) for m in (await store.read(2, 0, 1)).messages] == [b"after"]


@pytest.mark.anyio
async def test_sealing_early_adds_no_backlog_to_make_durable(tmp_path: Path) -> None:
    """The seal's filler skips up to a whole segment of logical offsets, but writes one
    small record: the store backlog (the alarm that blocks publishers) counts bytes written
    and not yet durable, not offsets. Counting offsets, a publish batch between the seal
    and its fsync read about 1 GiB of backlog and blocked every publisher."""
    config = _sealing_config(tmp_path)
    async with open_embedded_store(config) as store:
        await store.create_queue(1, 1)
        for i in range(400):  # ~ 100 KiB
            await store.append([rec(b"%05d" % i + FILL, (1, 0))])
        await store.commit_offset(QUEUE_GROUP, 1, 0, 400)
        await store.persist_offsets()
        await store.checkpoint()
        assert await store.backlog_bytes() == 0
        late = await store.append([rec(b"late" + FILL, (1, 0))], wait_durable=False)
        written = late.end_offset - store.log.durable_offset
        assert await store.backlog_bytes() == written
        await store.commit_offset(QUEUE_GROUP, 1, 0, 401)
        assert store.log.seal_consumed_active() is True
        assert store.log.commit_log.write_offset == 1 << 30
        # The record and the filler's header, not the skipped rest of the segment.
        assert written < await store.backlog_bytes() <= written + 64
        after = await store.append([rec(b"after" + FILL, (1, 0))], wait_durable=False)
        assert await store.backlog_bytes() <= written + 64 + (after.end_offset - (1 << 30))
        await store.wait_durable(after.end_offset)
        assert await store.backlog_bytes() == 0
