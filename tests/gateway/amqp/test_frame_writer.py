"""The hand-packed fast paths decode identically with pamqp; properties pass verbatim."""

from __future__ import annotations

import datetime
import decimal
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands, header

from gateway.amqp import decode_properties, frame_writer
from tests.gateway.amqp.helpers import frame, handshake, open_channel, parse, publish

UTC = datetime.UTC


def full_properties() -> commands.Basic.Properties:
    return commands.Basic.Properties(
        content_type="application/json",
        content_encoding="gzip",
        headers={
            "str": "value",
            "int8": -5,
            "int16": 1000,
            "int32": -70000,
            "int64": 2**40,
            "bool": True,
            "float": 1.5,
            "decimal": decimal.Decimal("3.14"),
            "ts": datetime.datetime(2024, 5, 1, 12, 0, tzinfo=UTC),
            "void": None,
            "bytes": bytearray(b"\x00\xffraw"),
            "array": [1, "two", [3, {"deep": False}], None],
            "nested": {"a": {"b": {"c": [decimal.Decimal("0.5")]}}},
        },
        delivery_mode=2,
        priority=7,
        correlation_id="corr-1",
        reply_to="amq.rabbitmq.reply-to",
        expiration="60000",
        message_id="m-1",
        timestamp=datetime.datetime(2023, 1, 2, 3, 4, 5, tzinfo=UTC),
        message_type="order.created",
        user_id="guest",
        app_id="billing",
    )


# Types pamqp decodes but never emits ('d' double, 'l' int64 small, 'i' u32, 'x').
HAND_BUILT_HEADERS = (
    b"\x01d" + b"d" + struct.pack(">d", 0.1)
    + b"\x01l" + b"l" + struct.pack(">q", 3)
    + b"\x01u" + b"u" + struct.pack(">H", 65535)
    + b"\x01i" + b"i" + struct.pack(">I", 4_000_000_000)
    + b"\x01x" + b"x" + struct.pack(">I", 2) + b"\x01\x02"
    + b"\x01V" + b"V"
    + b"\x01D" + b"D" + b"\x02" + struct.pack(">i", 12345)
    + b"\x01A" + b"A" + struct.pack(">I", 10) + b"T" + struct.pack(">Q", 0) + b"V"
)  # fmt: skip
HAND_BUILT = (
    struct.pack(">H", 0x2000 | 0x0040)  # headers + timestamp
    + struct.pack(">I", len(HAND_BUILT_HEADERS))
    + HAND_BUILT_HEADERS
    + struct.pack(">Q", 1_700_000_000)
)


def test_incoming_property_bytes_are_kept_verbatim_and_decode_lazily() -> None:
    conn = handshake()
    open_channel(conn, 1)
    props = full_properties()
    pub = conn.receive_data(publish(1, b"{}", properties=props))[0]
    assert pub.properties_bytes == props.marshal()
    assert pub.properties == props
    assert pub.properties.headers["nested"]["a"]["b"]["c"] == [decimal.Decimal("0.5")]


def test_hand_built_property_bytes_roundtrip_exactly() -> None:
    conn = handshake()
    open_channel(conn, 1)
    data = frame(1, commands.Basic.Publish(exchange="", routing_key="q"))
    payload = struct.pack(">HHQ", 60, 0, 3) + HAND_BUILT
    data += struct.pack(">BHI", 2, 1, len(payload)) + payload + b"\xce"
    data += struct.pack(">BHI", 3, 1, 3) + b"abc\xce"
    pub = conn.receive_data(data)[0]
    assert pub.properties_bytes == HAND_BUILT
    headers = pub.properties.headers
    assert headers == {
        "d": 0.1,
        "l": 3,
        "u": 65535,
        "i": 4_000_000_000,
        "x": bytearray(b"\x01\x02"),
        "V": None,
        "D": decimal.Decimal("123.45"),
        "A": [datetime.datetime(1970, 1, 1, tzinfo=UTC), None],
    }
    assert pub.properties.timestamp == datetime.datetime.fromtimestamp(1_700_000_000, UTC)
    # And the same bytes go back out untouched in a delivery.
    conn.send_deliver(1, "ctag", 1, False, "", "q", pub.properties_bytes, pub.body)
    out = conn.data_to_send()
    assert HAND_BUILT in out
    (_, content) = parse(out)[1]
    assert content.properties == pub.properties


def _decoded(parts: list[bytes]) -> list[tuple[int, object]]:
    return parse(b"".join(parts))


@settings(max_examples=60, deadline=None)
@given(
    channel=st.integers(1, 65535),
    consumer_tag=st.text(max_size=60),
    delivery_tag=st.integers(0, 2**63 - 1),  # pamqp decodes longlong as signed
    redelivered=st.booleans(),
    exchange=st.text(max_size=60),
    routing_key=st.text(max_size=60),
    body=st.binary(max_size=20000),
    frame_max=st.sampled_from([4096, 4097, 8192, 131072]),
)
def test_deliver_matches_pamqp(
    channel: int,
    consumer_tag: str,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    body: bytes,
    frame_max: int,
) -> None:
    props = full_properties()
    parts = frame_writer.deliver(
        channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
        props.marshal(), body, frame_max,
    )  # fmt: skip
    decoded = _decoded(parts)
    assert {ch for ch, _ in decoded} == {channel}
    deliver, content = decoded[0][1], decoded[1][1]
    assert deliver.name == "Basic.Deliver"
    assert (deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered) == (
        consumer_tag,
        delivery_tag,
        redelivered,
    )
    assert (deliver.exchange, deliver.routing_key) == (exchange, routing_key)
    assert (content.class_id, content.weight, content.body_size) == (60, 0, len(body))
    assert content.properties == props
    bodies = [value.value for _, value in decoded[2:]]
    assert b"".join(bodies) == body
    assert all(len(b) == frame_max - 8 for b in bodies[:-1])
    assert all(0 < len(b) <= frame_max - 8 for b in bodies)
    try:  # pamqp refuses to build names outside the spec's pattern; we just send them
        method = commands.Basic.Deliver(
            consumer_tag, delivery_tag, redelivered, exchange, routing_key
        )
    except ValueError:
        return
    assert b"".join(parts).startswith(frame(channel, method))  # byte-identical method frame


@pytest.mark.parametrize("size", [0, 1, 4087, 4088, 4089, 8176, 8177, 3 * 4088])
def test_deliver_split_exactly_at_frame_max(size: int) -> None:
    conn = handshake(tune=(2047, 4096, 0))
    open_channel(conn, 1)
    body = bytes(i % 251 for i in range(size))
    assert conn.send_deliver(1, "c", 1, True, "ex", "rk", b"\x00\x00", body)
    out = conn.data_to_send()
    frames = []
    offset = 0
    while offset < len(out):
        frame_type, _, length = struct.unpack_from(">BHI", out, offset)
        assert length <= 4096 - 8 and out[offset + 7 + length] == 0xCE
        frames.append((frame_type, out[offset + 7 : offset + 7 + length]))
        offset += 8 + length
    assert [t for t, _ in frames[:2]] == [1, 2]
    chunks = [p for t, p in frames[2:]]
    assert all(t == 3 for t, _ in frames[2:])
    assert [len(c) for c in chunks] == [4088] * (size // 4088) + (
        [size % 4088] if size % 4088 else []
    )
    assert b"".join(chunks) == body


def test_get_ok_return_ack_nack_match_pamqp() -> None:
    props = commands.Basic.Properties(content_type="text/plain", delivery_mode=1)
    raw = props.marshal()
    get_ok = frame_writer.get_ok(3, 42, True, "ex", "rk", 7, raw, b"hello", 131072)
    expected = frame(3, commands.Basic.GetOk(42, True, "ex", "rk", 7))
    expected += frame(3, header.ContentHeader(0, 5, props))
    expected += struct.pack(">BHI", 3, 3, 5) + b"hello\xce"
    assert b"".join(get_ok) == expected

    returned = frame_writer.return_(2, 312, "NO_ROUTE", "ex", "rk", raw, b"", 131072)
    expected = frame(2, commands.Basic.Return(312, "NO_ROUTE", "ex", "rk"))
    expected += frame(2, header.ContentHeader(0, 0, props))
    assert b"".join(returned) == expected

    assert frame_writer.basic_ack(1, 99, True) == frame(1, commands.Basic.Ack(99, True))
    assert frame_writer.basic_nack(1, 5, False, True) == frame(
        1, commands.Basic.Nack(5, False, True)
    )
    assert frame_writer.heartbeat() == b"\x08\x00\x00\x00\x00\x00\x00\xce"


def test_content_header_from_raw_bytes() -> None:
    raw = full_properties().marshal()
    data = frame_writer.content_header(9, 1234, raw)
    assert data == frame(9, header.ContentHeader(0, 1234, full_properties()))


def test_reply_text_is_cut_to_a_shortstr() -> None:
    close = commands.Channel.Close(406, "PRECONDITION_FAILED - " + "é" * 300, 0, 0)
    _, decoded = parse(frame_writer.method(1, close))[0]
    assert len(decoded.reply_text.encode()) <= 255


property_values = st.fixed_dictionaries(
    {},
    optional={
        # pamqp treats "" as absent, so generate non-empty strings
        "content_type": st.text(min_size=1, max_size=20),
        "headers": st.dictionaries(
            st.text(min_size=1, max_size=10),
            st.one_of(
                st.integers(-(2**63), 2**63 - 1), st.text(max_size=10), st.booleans(), st.none()
            ),
            max_size=5,
        ),
        "delivery_mode": st.sampled_from([1, 2]),
        "priority": st.integers(0, 255),
        "correlation_id": st.text(min_size=1, max_size=20),
        # pamqp reads values above 2**32 - 1 as milliseconds, so stay below
        "timestamp": st.integers(0, 2**32 - 1).map(
            lambda s: datetime.datetime.fromtimestamp(s, UTC)
        ),
    },
)


@settings(max_examples=60, deadline=None)
@given(values=property_values)
def test_property_bytes_roundtrip(values: dict[str, object]) -> None:
    props = commands.Basic.Properties(**values)  # type: ignore[arg-type]
    raw = props.marshal()
    assert decode_properties(raw) == props
    conn = handshake()
    open_channel(conn, 1)
    pub = conn.receive_data(publish(1, b"x", properties=props))[0]
    assert pub.properties_bytes == raw and pub.properties == props
