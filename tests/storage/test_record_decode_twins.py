"""The record decoder's compiled twin (speedups/mqgw_speedups/record_decode.pyx) against the
pure one (storage/record_decode.py): on runs of records as the commit log writes them, whole
or damaged (a byte flipped, a record made a hole or a copy, an entry that does not match its
record, a buffer cut short), the same messages appended and the same answer, or the same
exception type. The store's own suites (test_log_store.py, test_recovery.py, ...) read
through whichever twin is in use."""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage import record_decode, twins
from storage.log import reading
from storage.record import (
    COPY_MAGIC,
    HEADER_SIZE,
    HOLE_MAGIC,
    RELOCATED_ENTRY,
    Record,
)
from storage.record_encode import DestinationCache, encode_chunk
from tests.harness.twins import built_twin

PROPERTY = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def compiled() -> Any:
    return built_twin(record_decode)


def test_the_store_reads_through_the_compiled_twin_unless_pure_is_forced() -> None:
    chosen = record_decode if twins.pure_forced() else compiled()
    assert reading.decode_run is chosen.decode_run
    assert compiled().__file__.endswith(".so")


SHORT = st.binary(max_size=8)
RECORDS = st.lists(
    st.builds(
        Record,
        exchange=SHORT,
        routing_key=SHORT,
        properties=SHORT,
        body=st.binary(max_size=200),
        destinations=st.sampled_from([((1, 0),), ((1, 0), (2, 3)), ((9, 1),)]),
        born_ts_ms=st.integers(0, (1 << 64) - 1),
        flags=st.integers(0, (1 << 32) - 1),
    ),
    min_size=1,
    max_size=8,
)


def _chunk(records: list[Record], base: int) -> tuple[bytearray, list[tuple[Any, ...]]]:
    """What the commit log writes at ``base``, and the consume-queue entries of its records."""
    offsets: list[int] = []
    chunk = encode_chunk(records, 0, base, 1 << 20, 1234, 1 << 20, DestinationCache(), [], offsets)
    ends = [*offsets[1:], base + len(chunk.data)]
    entries: list[tuple[Any, ...]] = [(o, e - o, 1234) for o, e in zip(offsets, ends, strict=True)]
    return bytearray(chunk.data), entries


@st.composite
def damaged(draw: st.DrawFn) -> tuple[Any, list[Any], int]:
    base = draw(st.sampled_from([0, 4096, (1 << 40) + 52]))
    data, entries = _chunk(draw(RECORDS), base)
    for _ in range(draw(st.sampled_from([0, 1, 1, 2, 3]))):
        k = draw(st.integers(0, len(entries) - 1))
        if type(entries[k]) is not tuple or len(entries[k]) != 3:
            continue  # damaged beyond further damage
        commit, size, ts = entries[k]
        if type(commit) is not int or type(size) is not int:
            continue  # damaged beyond further damage
        pos = commit - base
        if not 0 <= pos <= len(data) - HEADER_SIZE:
            continue  # pointed elsewhere already
        kind = draw(st.integers(0, 10))
        if kind == 0:  # a byte flipped anywhere (crc, magic, sizes, lengths)
            at = draw(st.integers(0, len(data) - 1))
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind in (1, 2):  # a hole left by a repair, a copy left by the collector
            struct.pack_into("<I", data, pos + 4, HOLE_MAGIC if kind == 1 else COPY_MAGIC)
        elif kind == 3:  # an entry re-pointed (its size's high bit) or of another size
            size = draw(st.sampled_from([size | RELOCATED_ENTRY, size + 1, size - 1, 3]))
        elif kind == 4:  # an entry pointing elsewhere: before the buffer, into a record
            commit = draw(st.sampled_from([commit + 4, commit - 1, base - 8, base - 60]))
        elif kind == 5:  # the header's lengths claim more than the record holds
            struct.pack_into("<I", data, pos + 48, draw(st.sampled_from([1 << 20, 0xFFFFFFFF])))
        elif kind == 6:  # numbers no entry holds, or not ints at all
            commit = draw(st.sampled_from([1 << 63, 1 << 70, -(1 << 70), True, 1.0]))
        elif kind == 7:
            size = draw(st.sampled_from([1 << 70, -1, False]))
        elif kind == 8:  # not a 3-tuple
            entries[k] = draw(st.sampled_from([[commit, size, ts], (commit, size), None]))
            continue
        elif kind == 9:  # a record shorter than a header
            size = draw(st.integers(0, HEADER_SIZE))
        else:  # a record that says it lives elsewhere (its physical offset)
            struct.pack_into("<Q", data, pos + 12, commit + draw(st.sampled_from([1, -commit])))
        entries[k] = (commit, size, ts)
    cut = len(data) if draw(st.integers(0, 4)) else draw(st.integers(0, len(data)))
    buf: Any = memoryview(bytes(data[:cut]))
    shape = draw(st.integers(0, 12))
    if shape == 0:
        buf = buf.cast("B") if cut % 4 else buf.cast("I")  # another item size: pure's way
    elif shape == 1:
        buf = bytes(data[:cut])  # not a memoryview
    elif shape == 2:
        buf = memoryview(bytes(data[:cut]))[::2]  # not contiguous
    return buf, entries, base


def outcome(function: Any, buf: Any, entries: list[Any], *args: Any, keep: Any = None) -> Any:
    messages: list[Any] = []
    try:
        answer = function(buf, entries, *args, messages, keep)
    except Exception as error:  # the twins must agree on the exception type
        answer = ("raised", type(error))
    kept = None if keep is None else {c: _plain(k) for c, k in keep.items()}
    return answer, [_plain(m) for m in messages], kept


def _plain(fields: Any) -> Any:
    return tuple(bytes(f) if isinstance(f, memoryview) else f for f in fields)


@PROPERTY
@given(
    case=damaged(),
    window=st.one_of(st.none(), st.tuples(st.integers(-1, 9), st.integers(-1, 10))),
    first_offset=st.one_of(st.integers(0, 1 << 40), st.sampled_from([-3, 1 << 70])),
    shift=st.sampled_from([0] * 6 + [1, -1, 1 << 70]),
    verify=st.sampled_from([True, False, 1, None]),
    keeping=st.booleans(),
)
def test_twins_agree(
    case: tuple[Any, list[Any], int],
    window: tuple[int, int] | None,
    first_offset: int,
    shift: int,
    verify: Any,
    keeping: bool,
) -> None:
    buf, entries, base = case
    start, stop = (0, len(entries)) if window is None else window
    args = (start, stop, base + shift, first_offset, verify)
    pure = outcome(record_decode.decode_run, buf, entries, *args, keep={} if keeping else None)
    twin = outcome(compiled().decode_run, buf, entries, *args, keep={} if keeping else None)
    assert twin == pure


@st.composite
def kept_case(draw: st.DrawFn) -> tuple[list[Any], dict[int, Any], dict[int, Any], int]:
    """Entries and what a fan-out's read kept of them, split into generations, some of it
    gone or not as decode_run keeps it; a floor somewhere about."""
    base = draw(st.sampled_from([0, 4096, (1 << 40) + 52]))
    data, entries = _chunk(draw(RECORDS), base)
    keep: dict[int, Any] = {}
    record_decode.decode_run(memoryview(bytes(data)), entries, 0, len(entries), base, 0, True,
                             [], keep)  # fmt: skip
    young: dict[int, Any] = {}
    old: dict[int, Any] = {}
    for commit, record in keep.items():
        where = draw(st.sampled_from(["young", "young", "old", "gone", "odd"]))
        odd = [record[:7], (record[0] + 1, *record[1:]), ("x", *record[1:])]  # not as kept
        kept = draw(st.sampled_from(odd)) if where == "odd" else record
        (old if where == "old" else young if where != "gone" else {})[commit] = kept
    damaged_at = draw(st.sets(st.integers(0, len(entries) - 1), max_size=2))
    for k in damaged_at:
        commit, size, ts = entries[k]
        entries[k] = draw(st.sampled_from([
            (commit, size | RELOCATED_ENTRY, ts), (commit, size + 1, ts), (1 << 70, size, ts),
            (commit, -1, ts), (commit, 1.0, ts), (commit, size), None, [commit, size, ts],
        ]))  # fmt: skip
    floor = base + draw(st.sampled_from([0, 0, 0, 1, 200, 1 << 20, -(1 << 70)]))
    return entries, young, old, floor


def taken(function: Any, entries: list[Any], *args: Any) -> Any:
    messages: list[Any] = []
    try:
        answer = function(entries, *args, messages)
    except Exception as error:  # the twins must agree on the exception type
        answer = ("raised", type(error))
    return answer, [_plain(m) for m in messages]


@PROPERTY
@given(
    case=kept_case(),
    window=st.one_of(st.none(), st.tuples(st.integers(-1, 9), st.integers(-1, 10))),
    first_offset=st.one_of(st.integers(0, 1 << 40), st.sampled_from([-3, 1 << 70])),
)
def test_twins_take_kept_records_alike(
    case: tuple[list[Any], dict[int, Any], dict[int, Any], int],
    window: tuple[int, int] | None,
    first_offset: int,
) -> None:
    entries, young, old, floor = case
    start, stop = (0, len(entries)) if window is None else window
    args = (start, stop, first_offset, floor, young, old)
    pure = taken(record_decode.take_kept, entries, *args)
    assert taken(compiled().take_kept, entries, *args) == pure


def test_kept_records_are_taken_as_decoded_with_their_own_offsets() -> None:
    fanout, single = ((1, 0), (2, 0)), ((1, 0),)
    records = [Record(b"e", b"k", b"p", b"body%d" % i, d) for i, d in
               enumerate([fanout, single, fanout, fanout])]  # fmt: skip
    data, entries = _chunk(records, 4096)
    for twin in (record_decode, compiled()):
        decoded: list[Any] = []
        keep: dict[int, Any] = {}
        assert twin.decode_run(memoryview(bytes(data)), entries, 0, 4, 4096, 0, True, decoded,
                               keep) is None  # fmt: skip
        assert sorted(keep) == [entries[k][0] for k in (0, 2, 3)]  # not the single's
        found: list[Any] = []
        # Taken from its start while kept (entry 1 is not), from either generation, and
        # none below the floor (the commitlog's first offset).
        assert twin.take_kept(entries, 0, 4, 50, 0, keep, {}, found) == 1
        assert twin.take_kept(entries, 2, 4, 50, entries[3][0], keep, {}, found) == 2
        assert twin.take_kept(entries, 2, 4, 50, entries[2][0], {}, keep, found) == 4
        assert [_plain(m) for m in found] == [
            _plain((50 + k, *_plain(decoded[k])[1:])) for k in (0, 2, 3)
        ]


@given(records=RECORDS, verify=st.booleans())
@settings(max_examples=200, deadline=None)
def test_whole_runs_decode_to_what_was_written(records: list[Record], verify: bool) -> None:
    data, entries = _chunk(records, 4096)
    for twin in (record_decode, compiled()):
        messages: list[Any] = []
        assert twin.decode_run(memoryview(bytes(data)), entries, 0, len(entries), 4096, 70,
                               verify, messages) is None  # fmt: skip
        assert [m.queue_offset for m in messages] == list(range(70, 70 + len(records)))
        assert [m.commit_offset for m in messages] == [e[0] for e in entries]
        assert [(m.exchange, m.routing_key, bytes(m.properties), bytes(m.body), m.born_ts_ms,
                 m.store_ts_ms, m.flags) for m in messages] == [
            (r.exchange, r.routing_key, r.properties, r.body, r.born_ts_ms, 1234, r.flags)
            for r in records
        ]  # fmt: skip
        assert all(isinstance(m.body, memoryview) for m in messages)


def test_a_flipped_body_byte_is_a_crc_mismatch_only_when_verifying() -> None:
    data, entries = _chunk([Record(b"", b"q", b"\x00\x00", b"hello", ((1, 0),))], 0)
    data[-1] ^= 0xFF
    for twin in (record_decode, compiled()):
        found: list[Any] = []
        bad = twin.decode_run(memoryview(bytes(data)), entries, 0, 1, 0, 0, True, found)
        assert (bad, found) == ((0, record_decode.CRC_MISMATCH), [])
        kept: list[Any] = []
        assert twin.decode_run(memoryview(bytes(data)), entries, 0, 1, 0, 0, False, kept) is None
        assert bytes(kept[0].body) == b"hello"[:-1] + bytes([ord("o") ^ 0xFF])
