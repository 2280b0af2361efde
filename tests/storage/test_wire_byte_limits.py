"""APPEND's byte limits on the wire: they survive a round trip with the length limits beside
them, and a frame cut anywhere in them is a ProtocolError."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage import Record
from storage.wire import protocol as wire
from storage.wire.frames import FRAME_HEAD_SIZE, FrameDecoder, ProtocolError
from storage.wire.requests import Append

u32 = st.integers(0, 2**32 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
limit_lists = st.lists(st.tuples(u32, i64), max_size=5)


@given(limit_lists, limit_lists, st.binary(max_size=40))
def test_byte_limits_round_trip(
    limits: list[tuple[int, int]], byte_limits: list[tuple[int, int]], body: bytes
) -> None:
    request = Append([Record(b"e", b"k", b"p", body, ((1, 0),))], True, 7, limits, byte_limits)
    (frame,) = FrameDecoder().feed(wire.encode_request(3, request))
    decoded = wire.decode_request(frame)
    assert isinstance(decoded, Append)
    assert (list(decoded.limits), list(decoded.byte_limits)) == (limits, byte_limits)
    assert decoded.records == request.records


@given(st.lists(st.tuples(u32, i64), min_size=1, max_size=3), st.integers(1, 40))
def test_a_frame_cut_in_the_byte_limits_is_a_protocol_error(
    byte_limits: list[tuple[int, int]], cut: int
) -> None:
    data = wire.encode_request(1, Append([], False, 0, [(1, 5)], byte_limits))
    cut = min(cut, len(byte_limits) * 12 + 2)  # within the byte limits and their count
    short = data[: len(data) - cut]
    patched = struct.pack("<I", len(short) - 4) + short[4:]
    assert len(patched) >= FRAME_HEAD_SIZE
    (frame,) = FrameDecoder().feed(patched)
    with pytest.raises(ProtocolError):
        wire.decode_request(frame)
