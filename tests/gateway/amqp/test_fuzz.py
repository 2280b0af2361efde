"""Fuzz: generated and mutated client streams, fed in random splits.

The invariant (h11's): input is either accepted (events) or answered as an AMQP
error (a close in the output, or a silent close during the handshake); no other
exception ever escapes, and everything the server writes is well-formed.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import body, commands, exceptions, header
from pamqp import frame as pamqp_frame

from gateway.amqp import ServerConnection, decode_properties, events
from gateway.amqp.errors import AMQPError
from gateway.amqp.frame_reader import PROTOCOL_HEADER, FrameReader
from gateway.amqp.publish_cut import properties_well_formed
from gateway.amqp.sasl import parse_response
from tests.gateway.amqp.helpers import frame, start_ok

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

CHANNEL_METHODS: list[Any] = [
    commands.Channel.Open(),
    commands.Channel.Close(200, "bye", 0, 0),
    commands.Channel.CloseOk(),
    commands.Channel.Flow(active=True),
    commands.Basic.Qos(prefetch_count=3),
    commands.Basic.Consume(queue="q", consumer_tag="c"),
    commands.Basic.Ack(delivery_tag=1),
    commands.Basic.Reject(delivery_tag=2),
    commands.Basic.Get(queue="q"),
    commands.Queue.Declare(queue="q", arguments={"x-max-length": 10}),
    commands.Exchange.Declare(exchange="e"),
    commands.Confirm.Select(),
    commands.Tx.Select(),
]
CONNECTION_METHODS: list[Any] = [
    commands.Connection.Close(200, "bye", 0, 0),
    commands.Connection.CloseOk(),
    commands.Connection.TuneOk(10, 4096, 5),
    commands.Connection.Open("/"),
]


@st.composite
def client_frames(draw: st.DrawFn) -> bytes:
    # Weighted towards frames that keep the connection alive, so that later
    # frames reach deep states; the rest probe every error path.
    kind = draw(
        st.sampled_from(
            ["method"] * 4
            + ["publish"] * 4
            + ["cut"] * 2
            + ["raw"] * 2
            + ["header", "body", "heartbeat", "conn"]
        )
    )
    channel = draw(st.sampled_from([1, 1, 1, 2, 2, 0, 3, 70]))
    if kind == "method":
        return frame(channel, draw(st.sampled_from(CHANNEL_METHODS)))
    if kind == "conn":
        return frame(0, draw(st.sampled_from(CONNECTION_METHODS)))
    if kind == "publish":
        payload = draw(st.binary(max_size=300))
        props = commands.Basic.Properties(
            content_type=draw(st.sampled_from([None, "text/plain"])),
            headers=draw(st.sampled_from([None, {"a": [1, "b", {"c": None}]}])),
        )
        data = frame(channel, commands.Basic.Publish(exchange="", routing_key="q"))
        data += frame(channel, header.ContentHeader(0, len(payload), props))
        step = draw(st.integers(1, 120))
        for i in range(0, len(payload), step):
            data += frame(channel, body.ContentBody(payload[i : i + step]))
        return data
    if kind == "header":
        size = draw(st.integers(0, 2**20))
        return frame(channel, header.ContentHeader(0, size, commands.Basic.Properties()))
    if kind == "body":
        return frame(channel, body.ContentBody(draw(st.binary(min_size=1, max_size=50))))
    if kind == "heartbeat":
        return b"\x08" + channel.to_bytes(2, "big") + b"\x00\x00\x00\x00\xce"
    if kind == "cut":
        # A valid frame whose payload is truncated, with a consistent size field:
        # exercises every "field runs past the end" path of the decoders.
        whole = frame(channel, draw(st.sampled_from(CHANNEL_METHODS + CONNECTION_METHODS)))
        keep = draw(st.integers(0, len(whole) - 8))
        return whole[:3] + keep.to_bytes(4, "big") + whole[7 : 7 + keep] + b"\xce"
    raw = draw(st.one_of(st.binary(max_size=5), st.binary(max_size=40)))
    frame_type = draw(st.sampled_from([1, 2, 3, 8, 9]))
    return (
        bytes([frame_type])
        + channel.to_bytes(2, "big")
        + len(raw).to_bytes(4, "big")
        + raw
        + b"\xce"
    )


def handshake_bytes(capabilities: dict[str, Any]) -> bytes:
    return (
        PROTOCOL_HEADER
        + start_ok(capabilities=capabilities)
        + frame(0, commands.Connection.TuneOk(10, 4096, 5))
        + frame(0, commands.Connection.Open("/"))
    )


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(0, 4))):
        if not out:
            break
        pos = draw(st.integers(0, len(out) - 1))
        action = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if action == "flip":
            out[pos] = draw(st.integers(0, 255))
        elif action == "insert":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif action == "delete":
            del out[pos : pos + draw(st.integers(1, 8))]
        else:
            del out[pos:]
    return bytes(out)


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    caps = draw(st.sampled_from([{}, {"authentication_failure_close": True}]))
    opens = b"".join(
        frame(ch, commands.Channel.Open()) for ch in draw(st.sampled_from([(), (1,), (1, 2)]))
    )
    frames = b"".join(draw(st.lists(client_frames(), max_size=12)))
    stream = handshake_bytes(caps) + opens + frames
    return draw(mutated(stream)) if draw(st.booleans()) else stream


def parse(data: bytes) -> None:
    """Decode everything the server sent, as pamqp (a client) does, with one exception: a
    content header carrying what RabbitMQ 3.10 stores and delivers verbatim but pamqp refuses,
    a shortstr (a property or a header's key) that is not UTF-8 or the flag-continuation bit
    (RabbitMQ ignores the two low flag bits). The gateway passes them on as RabbitMQ does
    (tests/diff/test_diff_malformed_properties.py); anything else must decode."""
    while data:
        try:
            consumed = pamqp_frame.unmarshal(data)[0]
        except exceptions.UnmarshalingException as error:
            if not _passed_through_as_rabbitmq_does(data, error):
                raise
            consumed = 8 + int.from_bytes(data[3:7], "big")
        data = data[consumed:]


def _passed_through_as_rabbitmq_does(data: bytes, error: Exception) -> bool:
    size = int.from_bytes(data[3:7], "big")
    if data[0] != 2 or len(data) < 8 + size or data[7 + size] != 0xCE:
        return False
    properties = data[7 + 12 : 7 + size]
    if not properties_well_formed(properties):
        return False  # RabbitMQ would have closed the connection: never to be delivered
    cause = error.__cause__
    continuation = properties[1] & 1 and "flags are truncated" in str(cause)
    return isinstance(cause, UnicodeDecodeError) or bool(continuation)


def drive(conn: ServerConnection, data: bytes, cuts: list[int], decisions: list[bool]) -> None:
    """Feed ``data`` split at ``cuts``; answer decisions; check the invariant."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    now = 0.0
    closing_seen = False
    pending: list[events.Event] = []
    for start, end in itertools.pairwise(points):
        pending += conn.receive_data(data[start:end])
        while pending:
            event = pending.pop(0)
            yes = decisions.pop() if decisions else True
            if isinstance(event, events.AuthRequested):
                pending += conn.accept_auth() if yes else conn.reject_auth("fuzz")
            elif isinstance(event, events.VHostOpenRequested):
                pending += conn.accept_vhost() if yes else conn.reject_vhost()
            elif isinstance(event, events.ChannelCloseRequested) and yes:
                conn.channel_close_ok(event.channel)
            elif isinstance(event, events.Publish):
                assert isinstance(event.body, bytes | bytearray)  # bytearray: a multi-frame body
                with contextlib.suppress(AMQPError):  # lazy decode: only AMQPError may escape
                    event.properties  # noqa: B018
                conn.send_deliver(
                    event.channel, "c", 1, False, "", "q", event.properties_bytes, event.body
                )
            elif isinstance(event, events.ConnectionCloseSent):
                closing_seen = True
        now += 1.0
        conn.tick(now)
        out = conn.data_to_send()
        if out.startswith(b"AMQP"):
            assert out == b"AMQP\x00\x00\x09\x01"
        else:
            parse(out)  # every byte we write is a well-formed frame
    if closing_seen:
        assert conn.state.value in ("closing", "closed")


@FUZZ
@given(
    data=streams(),
    cuts=st.lists(st.integers(0, 10_000), max_size=8),
    decisions=st.lists(st.booleans(), max_size=6),
)
def test_connection_never_leaks_other_exceptions(
    data: bytes, cuts: list[int], decisions: list[bool]
) -> None:
    drive(
        ServerConnection(channel_max=10, frame_max=4096, max_message_size=5000),
        data,
        cuts,
        decisions,
    )


@FUZZ
@given(data=st.binary(max_size=600), cuts=st.lists(st.integers(0, 600), max_size=5))
def test_random_bytes_after_handshake(data: bytes, cuts: list[int]) -> None:
    stream = handshake_bytes({}) + frame(1, commands.Channel.Open()) + data
    drive(ServerConnection(frame_max=4096), stream, cuts, [])


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200), frame_max=st.integers(0, 64))
def test_frame_reader_raises_only_frame_errors(data: bytes, frame_max: int) -> None:
    reader = FrameReader(frame_max, expect_protocol_header=False)
    reader.feed(data)
    with contextlib.suppress(AMQPError):
        list(reader)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200))
def test_property_decoding_raises_only_amqp_errors(data: bytes) -> None:
    with contextlib.suppress(AMQPError):
        decode_properties(data)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=100), mechanism=st.sampled_from(["PLAIN", "AMQPLAIN"]))
def test_sasl_parsing_raises_only_amqp_errors(data: bytes, mechanism: str) -> None:
    with contextlib.suppress(AMQPError):
        parse_response(mechanism, data)


def test_deeply_nested_table_is_a_frame_error_not_recursion() -> None:
    inner = b""
    for _ in range(3000):
        inner = b"\x01aF" + len(inner).to_bytes(4, "big") + inner
    args = b"\x00\x00\x01q" + b"\x00" + len(inner).to_bytes(4, "big") + inner
    payload = b"\x00\x32\x00\x0a" + args
    conn = ServerConnection(frame_max=131072)
    stream = handshake_bytes({}) + frame(1, commands.Channel.Open())
    stream = stream.replace(
        frame(0, commands.Connection.TuneOk(10, 4096, 5)),
        frame(0, commands.Connection.TuneOk(10, 131072, 0)),
    )
    stream += b"\x01\x00\x01" + len(payload).to_bytes(4, "big") + payload + b"\xce"
    drive(conn, stream, [], [])
    assert conn.state.value == "closing"
