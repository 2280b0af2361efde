"""Framing: protocol header, frame limits, frame-end octet, frame types."""

from __future__ import annotations

import pytest
from pamqp import commands

from gateway.amqp import FrameReader, ServerConnection, events
from gateway.amqp.errors import FrameError
from gateway.amqp.frame_reader import PROTOCOL_HEADER, ProtocolHeaderReceived, RawFrame
from tests.gateway.amqp.helpers import close_of, frame, handshake


def test_frames_come_out_whatever_the_split() -> None:
    data = PROTOCOL_HEADER + frame(0, commands.Connection.TuneOk(1, 4096, 0)) * 3
    for step in (1, 2, 7, 8, 13, len(data)):
        reader = FrameReader(4096)
        items: list[object] = []
        for i in range(0, len(data), step):
            reader.feed(data[i : i + step])
            items += list(reader)
        assert items[0] == ProtocolHeaderReceived(PROTOCOL_HEADER)
        assert len(items) == 4
        assert all(isinstance(f, RawFrame) and f.frame_type == 1 for f in items[1:])
        assert reader.buffered_bytes == 0


def test_incomplete_frame_never_holds_more_than_frame_max_plus_8() -> None:
    reader = FrameReader(4096, expect_protocol_header=False)
    reader.feed(b"\x03\x00\x01\x00\x00\x10\x00" + b"x" * 4096)  # payload 4096 = frame_max
    assert list(reader) == []
    assert reader.buffered_bytes == 4096 + 7
    reader.feed(b"\xce")
    assert [f.payload for f in reader] == [b"x" * 4096]


def test_frame_over_frame_max_is_rejected_from_its_header() -> None:
    reader = FrameReader(4096, expect_protocol_header=False)
    reader.feed(b"\x03\x00\x01\x00\x00\x10\x01")  # 4097: only the 7-byte header arrived
    with pytest.raises(FrameError) as info:
        reader.next_frame()
    assert info.value.reply_text == (
        "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,4097,4088}"
    )
    assert reader.broken and reader.next_frame() is None


def test_frame_over_frame_max_closes_connection() -> None:
    conn = handshake(tune=(2047, 8192, 0))
    evs = conn.receive_data(b"\x03\x00\x01\x00\x00\x20\x01")
    close = close_of(conn.data_to_send())
    assert (close.reply_code, close.class_id, close.method_id) == (501, 0, 0)
    assert (
        close.reply_text == "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,8193,8184}"
    )
    # Framing is lost, so the connection is finished at once.
    assert conn.closed and isinstance(evs[0], events.ConnectionClosed)


def test_bad_frame_end() -> None:
    conn = handshake()
    evs = conn.receive_data(b"\x01\x00\x01\x00\x00\x00\x04\x00\x14\x00\x0a\x00")
    close = close_of(conn.data_to_send())
    assert close.reply_text == (
        "FRAME_ERROR - type 1, all octets = <<0,20,0,10>>: {invalid_frame_end_marker,0}"
    )
    assert conn.closed and evs[0].reply_code == 501


def test_unknown_frame_type_keeps_sync_and_waits_for_close_ok() -> None:
    conn = handshake()
    evs = conn.receive_data(b"\x09\x00\x00\x00\x00\x00\x00\xce")
    close = close_of(conn.data_to_send())
    assert close.reply_text == "FRAME_ERROR - type 9, all octets = <<>>: unknown_frame"
    assert isinstance(evs[0], events.ConnectionCloseSent)
    evs = conn.receive_data(frame(0, commands.Connection.CloseOk()))
    assert conn.closed and isinstance(evs[0], events.ConnectionClosed)


FE, UF = "FRAME_ERROR - type", "unknown_frame"


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"\x01\x00\x01\x00\x00\x00\x02ab\xce", f'{FE} 1, all octets = <<"ab">>: {UF}'),
        (b"\x02\x00\x01\x00\x00\x00\x03\x00\x3c\x00\xce", f"{FE} 2, all octets = <<0,60,0>>: {UF}"),
        (b"\x08\x00\x00\x00\x00\x00\x01\x00\xce", f"{FE} 8, all octets = <<0>>: {UF}"),
        (
            b"\x07\x00\x00\x00\x00\x00\x14" + bytes(range(20)) + b"\xce",
            f"{FE} 7, first 16 octets = <<0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15>>: {UF}",
        ),
    ],
)
def test_malformed_frame_shapes_are_unknown_frame(data: bytes, text: str) -> None:
    conn = handshake()
    conn.receive_data(data)
    assert close_of(conn.data_to_send()).reply_text == text


def test_heartbeat_on_channel_zero_is_fine_before_open() -> None:
    conn = ServerConnection()
    conn.receive_data(PROTOCOL_HEADER)
    assert conn.receive_data(b"\x08\x00\x00\x00\x00\x00\x00\xce") == []
    assert not conn.closed


def test_handshake_frames_larger_than_initial_frame_max_fail() -> None:
    conn = ServerConnection()
    conn.receive_data(PROTOCOL_HEADER)
    conn.data_to_send()
    evs = conn.receive_data(b"\x01\x00\x00\x00\x01\x00\x00")  # 65536 before tune
    assert conn.closed and evs[0].reply_code == 501
    assert conn.data_to_send() == b""  # during start, RabbitMQ closes without a close frame
