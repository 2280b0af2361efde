"""The record encoder's compiled twin (speedups/mqgw_speedups/record_encode.pyx) against the
pure one (storage/record_encode.py): same chunk bytes, same dispatch runs, same offsets, or the
same exception type, on random batches, valid and broken. The commit log's own suites
(test_log_store.py, test_recovery.py, ...) run on whichever twin is in use."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage import record_encode, twins
from storage.errors import RecordTooLarge
from storage.log import commit_log
from storage.record import CLOSES, HEADER, DispatchRun, Record, check_record
from storage.record_encode import DestinationCache
from tests.harness.twins import built_twin

PROPERTY = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def compiled() -> Any:
    return built_twin(record_encode)


def test_the_commit_log_uses_the_compiled_twin_unless_pure_is_forced() -> None:
    chosen = record_encode if twins.pure_forced() else compiled()
    assert commit_log.encode_chunk is chosen.encode_chunk
    assert compiled().__file__.endswith(".so")


DESTS = st.sampled_from([(), ((1, 0),), ((1, 0), (2, 3)), ((7, 1),), ((70000, 0),)])
SHORT = st.binary(max_size=6)


@st.composite
def records(draw: st.DrawFn) -> Any:
    """Mostly valid records; sometimes a field out of its range or of another type."""
    record = Record(
        exchange=draw(st.one_of(SHORT, st.just(b"x" * 256))),
        routing_key=draw(st.one_of(SHORT, st.just(b"k" * 255))),
        properties=draw(SHORT),
        body=draw(st.one_of(st.binary(max_size=300), st.binary(max_size=40).map(bytearray))),
        destinations=draw(DESTS),
        born_ts_ms=draw(st.one_of(st.integers(0, 1 << 64), st.sampled_from([-1, True]))),
        flags=draw(st.one_of(st.sampled_from([0, 1, CLOSES, CLOSES | 1]), st.just(1 << 32))),
    )
    if draw(st.integers(0, 30)) == 0:  # another type where bytes or an int belong
        field = draw(st.integers(0, 6))
        value = draw(st.sampled_from(["text", 1.5, memoryview(b"mv"), [(1, 0)], None]))
        return record._replace(**{Record._fields[field]: value})
    return record


def outcome(
    function: Any, batch: list[Any], *args: Any, runs: list[DispatchRun], warm: list[Any]
) -> Any:
    offsets: list[int] = []
    cache = DestinationCache()
    for destinations in warm:  # packed by earlier batches: found in the cache's dict
        cache.get(destinations)
    try:
        chunk = function(batch, *args, cache, runs, offsets)
    except Exception as error:  # the twins must agree on the exception type
        return "raised", type(error)
    return chunk, runs, offsets


@PROPERTY
@given(
    batch=st.lists(records(), max_size=8),
    first=st.integers(0, 3),
    start=st.integers(0, 1 << 40),
    space=st.one_of(st.integers(-10, 3000), st.just(1 << 30)),
    ts=st.integers(0, 1 << 64),
    most=st.integers(0, 800),
    earlier=st.one_of(st.none(), DESTS),
    warm=st.lists(DESTS, max_size=4),
)
def test_twins_agree(
    batch: list[Any],
    first: int,
    start: int,
    space: int,
    ts: int,
    most: int,
    earlier: tuple[tuple[int, int], ...] | None,
    warm: list[Any],
) -> None:
    first = min(first, len(batch))

    def runs() -> list[DispatchRun]:  # an earlier chunk's run the next records may continue
        return [] if earlier is None else [DispatchRun(earlier, bytearray(b"e" * 20))]

    args = (first, start, space, ts, most)
    pure = outcome(record_encode.encode_chunk, batch, *args, runs=runs(), warm=warm)
    assert outcome(compiled().encode_chunk, batch, *args, runs=runs(), warm=warm) == pure


def test_a_chunk_holds_checked_records_and_one_run_per_destination_change() -> None:
    batch = [
        Record(b"ex", b"key", b"\x10\x00\x02", b"a" * 1024, ((1, 0),), 5, 1),
        Record(b"ex", b"key", b"", bytearray(b"b" * 10), ((1, 0),), 6, 0),
        Record(b"", b"k2", b"", b"c", ((2, 1), (3, 0)), 7, CLOSES),
        Record(b"", b"k3", b"", b"d", (), 8, 0),
    ]
    runs: list[DispatchRun] = []
    offsets: list[int] = []
    chunk = compiled().encode_chunk(batch, 0, 4096, 1 << 20, 99, 1 << 20, DestinationCache(),
                                    runs, offsets)  # fmt: skip
    assert chunk.record_count == 4
    assert chunk.start == 4096
    pos = 0
    for offset, record in zip(offsets, batch, strict=True):
        assert offset == 4096 + pos
        check = check_record(bytes(chunk.data), pos, offset)
        assert check.problem == "", check.problem
        assert check.size > 0
        fields = HEADER.unpack_from(chunk.data, pos)
        assert fields[4] == record.born_ts_ms
        assert fields[5] == 99
        pos += fields[0]
    assert pos == len(chunk.data)
    assert [(run.destinations, len(run.entries) // 20, run.closes) for run in runs] == [
        (((1, 0),), 2, False),
        (((2, 1), (3, 0)), 1, True),
    ]


def test_a_record_too_large_is_refused_by_the_compiled_twin_too() -> None:
    batch = [Record(b"", b"q", b"", b"x" * 100, ((1, 0),)), Record(b"", b"q", b"", b"y" * 900, ())]
    runs: list[DispatchRun] = []
    with pytest.raises(RecordTooLarge):
        compiled().encode_chunk(batch, 0, 0, 1 << 20, 1, 500, DestinationCache(), runs)
