"""The broker protocol codec: every request and answer survives encode -> bytes split anywhere
-> FrameDecoder -> decode; errors come back as the same typed exceptions; garbage is refused
with ProtocolError and nothing else (h11's fuzz invariant)."""

from __future__ import annotations

import errno
import itertools
import struct
from contextlib import suppress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import (
    AppendResult,
    CorruptionError,
    DiskFull,
    PartitionStats,
    QueueExists,
    QueueStats,
    ReadResult,
    ReadStatus,
    Record,
    RecordTooLarge,
    RetentionReport,
    StoreClosed,
    StoredMessage,
    StoreError,
    StoreLocked,
    StoreWriteError,
    UnknownQueue,
)
from storage.wire import protocol as wire
from storage.wire.errors import encode_error
from storage.wire.frames import FRAME_HEAD_SIZE, Frame, FrameDecoder, ProtocolError
from storage.wire.requests import (
    QUERY_OPS,
    Append,
    CommitOffsets,
    CommittedOffset,
    CreateQueue,
    DeleteQueue,
    GetQueueStats,
    Hello,
    OffsetCommit,
    OffsetForTime,
    Op,
    Purge,
    Query,
    Read,
    RestartMarks,
    UncleanMarks,
    WaitDurable,
)

u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
i64 = st.integers(-(2**63), 2**63 - 1)
offset = st.integers(0, 2**63 - 1)
text = st.text(max_size=40)
dests = st.lists(st.tuples(u32, u16), max_size=4).map(tuple)
records = st.builds(
    Record,
    exchange=st.binary(max_size=30),
    routing_key=st.binary(max_size=60),
    properties=st.binary(max_size=80),
    body=st.binary(max_size=500),
    destinations=dests,
    born_ts_ms=offset,
    flags=u32,
)
requests = st.one_of(
    st.builds(Hello, u16, text),
    st.builds(
        Append,
        st.lists(records, max_size=8),
        st.booleans(),
        st.integers(0, 2**64 - 1),
        st.lists(st.tuples(u32, i64), max_size=4),
        st.lists(st.tuples(u32, i64), max_size=4),
    ),
    st.builds(WaitDurable, i64),
    st.builds(Read, u32, u32, i64, u32, i64, u32, i64),
    st.builds(CreateQueue, u32, u32),
    st.builds(DeleteQueue, u32),
    st.builds(Purge, u32, text),
    st.builds(GetQueueStats, u32, text),
    st.builds(
        CommitOffsets,
        st.lists(st.builds(OffsetCommit, text, u32, u32, i64, i64, i64, i64, u32), max_size=5),
    ),
    st.builds(CommittedOffset, text, u32, u32, i64),
    st.builds(OffsetForTime, u32, u32, i64),
    st.builds(UncleanMarks, u32),
    st.builds(RestartMarks, u32),
    st.sampled_from(sorted(QUERY_OPS)).map(Query),
)
messages = st.builds(
    StoredMessage,
    queue_offset=offset,
    commit_offset=offset,
    exchange=st.binary(max_size=30),
    routing_key=st.binary(max_size=60),
    properties=st.binary(max_size=80).map(memoryview),
    body=st.binary(max_size=500).map(memoryview),
    born_ts_ms=offset,
    store_ts_ms=offset,
    flags=u32,
)
id_values = st.dictionaries(u32, i64, max_size=5)
append_results = st.builds(
    AppendResult,
    start_offset=offset,
    end_offset=offset,
    record_count=u32,
    record_offsets=st.lists(offset, max_size=10).map(tuple),
    queue_starts=st.none() | st.dictionaries(st.tuples(u32, u16), offset, max_size=5),
    store_ts_ms=offset,
    refused=st.lists(st.tuples(u32, u32, u16), max_size=4).map(tuple),
)
read_results = st.builds(
    ReadResult, st.sampled_from(ReadStatus), st.lists(messages, max_size=6), i64, i64, i64, i64, i64
)
partitions = st.builds(PartitionStats, u16, i64, i64, i64, i64, i64, i64, u32, i64, i64)
responses = st.one_of(
    st.tuples(st.just(Op.HELLO), st.builds(Hello, u16, text)),
    st.tuples(st.just(Op.APPEND), append_results),
    st.tuples(st.just(Op.READ), read_results),
    st.tuples(st.sampled_from([Op.WAIT_DURABLE, Op.CREATE_QUEUE, Op.COMMIT_OFFSETS]), st.none()),
    st.tuples(st.sampled_from([Op.PURGE, Op.DISK_BYTES, Op.COMMITTED_OFFSET]), i64),
    st.tuples(
        st.sampled_from([Op.QUEUES, Op.HELD_BACK_BYTES, Op.UNCLEAN_MARKS, Op.RESTART_MARKS]),
        id_values,
    ),
    st.tuples(st.just(Op.OLDEST_SEGMENT_TS), st.none() | offset),
    st.tuples(
        st.just(Op.QUEUE_STATS),
        st.builds(QueueStats, u32, st.lists(partitions, max_size=4), i64, i64),
    ),
    st.tuples(st.just(Op.APPLY_RETENTION), st.builds(RetentionReport, i64, i64, id_values)),
)


def split_feed(data: bytes, cuts: list[int], decoder: FrameDecoder) -> list[Frame]:
    """Feed ``data`` in pieces cut at ``cuts`` (positions, any order, repeats allowed)."""
    frames: list[Frame] = []
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for start, end in itertools.pairwise(bounds):
        frames += decoder.feed(data[start:end])
    assert decoder.buffered_bytes == 0
    return frames


@settings(max_examples=300, deadline=None)
@given(st.lists(requests, min_size=1, max_size=6), st.lists(st.integers(0, 1 << 16)))
def test_requests_round_trip_split_anywhere(batch: list[wire.Request], cuts: list[int]) -> None:
    data = b"".join(wire.encode_request(i, request) for i, request in enumerate(batch))
    frames = split_feed(data, cuts, FrameDecoder())
    assert [frame.request_id for frame in frames] == list(range(len(batch)))
    assert [wire.decode_request(frame) for frame in frames] == batch


@settings(max_examples=300, deadline=None)
@given(st.lists(responses, min_size=1, max_size=6), st.lists(st.integers(0, 1 << 16)))
def test_responses_round_trip_split_anywhere(
    batch: list[tuple[Op, wire.Response]], cuts: list[int]
) -> None:
    data = b"".join(wire.encode_response(i + 7, op, value) for i, (op, value) in enumerate(batch))
    frames = split_feed(data, cuts, FrameDecoder())
    assert [(frame.request_id, frame.op) for frame in frames] == [
        (i + 7, op) for i, (op, _) in enumerate(batch)
    ]
    assert [wire.decode_response(frame) for frame in frames] == [value for _, value in batch]


ERRORS: list[Exception] = [
    RecordTooLarge(20_000_000, 16_842_752),
    DiskFull("no space left for the queue registry", errno.ENOSPC),
    StoreWriteError("fsync failed: EIO", errno.EIO),
    StoreWriteError("no errno"),
    UnknownQueue(12),
    UnknownQueue(12, 3),
    QueueExists("queue 4 has 2 partitions"),
    StoreClosed("the store is closed"),
    CorruptionError("00000000000000001024", 1100, "crc mismatch"),
    StoreLocked("/x is in use by another process"),
    StoreError("something else"),
    ValueError("partitions must be in 1..65535"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_errors_come_back_as_the_same_type_with_their_attributes(error: Exception) -> None:
    (frame,) = FrameDecoder().feed(encode_error(5, error))
    assert (frame.request_id, frame.op) == (5, Op.ERROR)
    with pytest.raises(type(error)) as raised:
        wire.decode_response(frame)
    got = raised.value
    assert type(got) is type(error)
    assert str(got) == str(error)
    assert vars(got) == vars(error)  # queue_id, partition, errno, size_bytes, ...


def test_an_unexpected_exception_travels_as_a_store_error_naming_it() -> None:
    (frame,) = FrameDecoder().feed(encode_error(1, KeyError("oops")))
    with pytest.raises(StoreError, match="broker internal error: KeyError"):
        wire.decode_response(frame)


def test_append_decodes_equal_destination_lists_into_one_tuple() -> None:
    """The store caches packed destinations by identity first: keep them shared."""
    batch = [Record(b"", b"", b"", b"%d" % i, ((1, 0), (2, 5))) for i in range(3)]
    (frame,) = FrameDecoder().feed(wire.encode_request(1, Append(batch, True)))
    decoded = wire.decode_request(frame)
    assert isinstance(decoded, Append)
    assert decoded.records[0].destinations is decoded.records[2].destinations


def test_read_messages_are_views_of_the_frame() -> None:
    message = StoredMessage(0, 0, b"x", b"k", memoryview(b"props"), memoryview(b"body"), 1, 2, 0)
    result = ReadResult(ReadStatus.FOUND, [message], 1, 0, 1)
    data = wire.encode_response(3, Op.READ, result)
    (frame,) = FrameDecoder().feed(data)
    decoded = wire.decode_response(frame)
    assert isinstance(decoded, ReadResult)
    body = decoded.messages[0].body
    assert isinstance(body, memoryview) and body.obj is data  # no copy: a slice of what came in


def test_frame_over_the_limit_is_refused_at_its_length() -> None:
    decoder = FrameDecoder(max_frame_bytes=1000)
    with pytest.raises(ProtocolError, match=r"frame length 5000 outside 5\.\.1000"):
        decoder.feed(struct.pack("<I", 5000))  # refused before any of its body arrives
    with pytest.raises(ProtocolError, match="outside"):
        FrameDecoder().feed(struct.pack("<IIB", 2, 0, 0))  # shorter than id + op


def test_large_frame_in_small_pieces_is_assembled_once() -> None:
    body = bytes(range(256)) * 8192  # 2 MiB
    data = wire.encode_request(9, Append([Record(b"e", b"k", b"p", body, ((1, 0),))], True))
    decoder = FrameDecoder()
    frames: list[Frame] = []
    for start in range(0, len(data), 65536):
        frames += decoder.feed(data[start : start + 65536])
    (frame,) = frames
    decoded = wire.decode_request(frame)
    assert isinstance(decoded, Append) and decoded.records[0].body == body


def test_payload_of_the_wrong_size_is_a_protocol_error() -> None:
    good = wire.encode_request(1, CreateQueue(1, 2))
    for bad in (good[:-1], good + b"\x00"):
        patched = struct.pack("<I", len(bad) - 4) + bad[4:]
        (frame,) = FrameDecoder().feed(patched)
        with pytest.raises(ProtocolError):
            wire.decode_request(frame)
    unknown_op = struct.pack("<IIB", 5, 1, 99)
    with pytest.raises(ProtocolError):
        wire.decode_request(FrameDecoder().feed(unknown_op)[0])


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300), st.lists(st.integers(0, 300)))
def test_garbage_is_refused_with_protocol_error_only(data: bytes, cuts: list[int]) -> None:
    decoder = FrameDecoder(max_frame_bytes=1 << 16)
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    try:
        for start, end in itertools.pairwise(bounds):
            for frame in decoder.feed(data[start:end]):
                for decode in (wire.decode_request, wire.decode_response):
                    # ProtocolError, or the typed error an ERROR frame carries
                    with suppress(StoreError, ValueError):
                        decode(frame)
    except ProtocolError:
        pass


@given(records.filter(lambda r: len(r.body) > 3), st.integers(1, 60))
def test_truncated_append_is_a_protocol_error(record: Record, cut: int) -> None:
    data = wire.encode_request(1, Append([record], False))
    cut = min(cut, len(data) - FRAME_HEAD_SIZE)
    short = data[: len(data) - cut]
    patched = struct.pack("<I", len(short) - 4) + short[4:]
    (frame,) = FrameDecoder().feed(patched)
    with pytest.raises(ProtocolError):
        wire.decode_request(frame)
