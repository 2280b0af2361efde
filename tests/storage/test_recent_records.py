"""A fan-out's records are decoded by the first queue that reads them back and taken as
kept by the others (storage/log/recent_records.py): the same messages a fresh read gives,
through appends, reads from anywhere, aging generations and a cut of the log's tail."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage import LogStore, Record, StoreConfig
from storage.replication.replica_log import truncate_log
from tests.storage.helpers import bodies, rec


def _open(config: StoreConfig, root: Path, recent_bytes: int, queues: int = 3) -> LogStore:
    config = dataclasses.replace(config, data_dir=root, recent_records_bytes=recent_bytes)
    store = LogStore.open(config, clock=lambda: 1_000)
    for queue_id in range(1, queues + 1):
        store.create_queue(queue_id, 1)
    return store


def test_a_fanouts_records_are_decoded_once_for_all_its_queues(
    small_config: StoreConfig, tmp_path: Path
) -> None:
    store = _open(small_config, tmp_path / "kept", 1 << 20)
    try:
        both = ((1, 0), (2, 0))
        store.append([rec(b"both", *both), rec(b"one", (1, 0)), rec(b"too", *both)])
        first = store.read(1, 0, 0).messages
        assert bodies(first) == [b"both", b"one", b"too"]
        assert len(store.commit_log.recent) == 2  # the record for one queue is not kept
        second = store.read(2, 0, 0).messages
        assert bodies(second) == [b"both", b"too"]
        assert [m.queue_offset for m in second] == [0, 1]  # its own offsets
        assert second[0].body.obj is first[0].body.obj  # taken as kept: no second read
        assert second[1].commit_offset == first[2].commit_offset
    finally:
        store.close()
    fresh = _open(small_config, tmp_path / "fresh", 0)
    try:
        fresh.append([rec(b"both", (1, 0), (2, 0))])
        one, two = fresh.read(1, 0, 0).messages[0], fresh.read(2, 0, 0).messages[0]
        assert len(fresh.commit_log.recent) == 0 and one.body.obj is not two.body.obj
    finally:
        fresh.close()


def test_a_cut_tail_is_not_served_as_kept(small_config: StoreConfig, tmp_path: Path) -> None:
    """A slave cutting its divergent tail writes other records at the same offsets."""
    store = _open(small_config, tmp_path / "store", 1 << 20)
    try:
        store.append([rec(b"kept", (1, 0), (2, 0))])
        cut_at = store.append([rec(b"old", (1, 0), (2, 0))]).start_offset
        assert bodies(store.read(1, 0, 0).messages) == [b"kept", b"old"]
        truncate_log(store, cut_at)
        store.append([rec(b"new", (1, 0), (2, 0))])  # at the offset "old" had
        assert bodies(store.read(2, 0, 0).messages) == [b"kept", b"new"]
    finally:
        store.close()


BODIES = st.binary(min_size=0, max_size=300)
DESTS = st.lists(st.integers(1, 3), min_size=1, max_size=3, unique=True)
STEP = st.one_of(
    st.tuples(st.just("append"), st.lists(st.tuples(BODIES, DESTS), min_size=1, max_size=6)),
    st.tuples(st.just("read"), st.integers(1, 3), st.integers(0, 40), st.integers(1, 12)),
    st.tuples(st.just("cut"), st.integers(0, 12)),
)


@given(steps=st.lists(STEP, min_size=1, max_size=30), limit=st.sampled_from([300, 2000, 1 << 20]))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_kept_reads_give_what_fresh_reads_give(steps: list[tuple[Any, ...]], limit: int) -> None:
    config = StoreConfig(
        Path("."), segment_size_bytes=4096, cq_entries_per_segment=16, max_record_bytes=1024
    )
    with tempfile.TemporaryDirectory() as root:
        kept = _open(config, Path(root) / "kept", limit)
        fresh = _open(config, Path(root) / "fresh", 0)
        starts: list[int] = []  # each append's first commit offset (where a cut may go)
        try:
            for step in steps:
                if step[0] == "append":
                    records = [rec(body, *((q, 0) for q in dests)) for body, dests in step[1]]
                    starts.append(_same(kept.append, fresh.append, records).start_offset)
                elif step[0] == "read":
                    _, queue, offset, count = step
                    _same(kept.read, fresh.read, queue, 0, offset, count)
                elif starts:
                    at = starts[step[1] % len(starts)]
                    _same(lambda a: truncate_log(kept, a), lambda a: truncate_log(fresh, a), at)
                    starts = [s for s in starts if s < at]
            for queue in (1, 2, 3):
                _same(kept.read, fresh.read, queue, 0, 0, 1000)
        finally:
            kept.close()
            fresh.close()


def _same(kept: Any, fresh: Any, *args: Any) -> Any:
    """Both stores' answers, equal as plain values (views as bytes)."""
    a, b = kept(*args), fresh(*args)
    assert _plain(a) == _plain(b)
    return a


def _plain(value: Any) -> Any:
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, Record):
        return value
    if isinstance(value, (list, tuple)):
        return (
            type(value)(_plain(v) for v in value)
            if not hasattr(value, "_fields")
            else (tuple(_plain(v) for v in value))
        )
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value
