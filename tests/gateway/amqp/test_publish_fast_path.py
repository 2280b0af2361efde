"""The fused publish path (FrameReader.next_publish) must be indistinguishable from reading
the same bytes frame by frame: same events, same bytes written, same state, whatever the
stream holds (valid publishes, broken frames, other methods, random splits)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from gateway.amqp import ServerConnection
from gateway.amqp.events import Publish
from gateway.amqp.frame_reader import FrameReader
from tests.gateway.amqp.helpers import frame, handshake, open_channel, publish

PIECES = st.one_of(
    st.builds(
        lambda ch, body, ex, rk: publish(ch, body, exchange=ex, routing_key=rk, frame_max=4096),
        st.sampled_from([1, 2, 3]),
        st.binary(max_size=9000),
        st.sampled_from(["", "amq.direct", "x"]),
        st.text(max_size=5),
    ),
    st.sampled_from(
        [
            frame(1, commands.Basic.Ack(delivery_tag=1)),
            frame(2, commands.Channel.Close(200, "bye", 0, 0)),
            frame(3, commands.Channel.Open()),
            b"\x03\x00\x01\x00\x00\x00\x02ab\xce",  # a stray body frame
            b"\x01\x00\x01\x00\x00\x00\x04\x00\x3c\x00\x28\xce",  # a truncated publish
            publish(1, b"bad end")[:-1] + b"\x00",  # the body frame's end octet is wrong
            publish(1, b"size")[:-12] + b"\x00\x00\x00\x00\x05size\xce",  # body != header size
        ]
    ),
    st.binary(min_size=1, max_size=20),  # noise
)


def _describe(item: Any) -> Any:
    if isinstance(item, Publish):
        return ("publish", item.channel, item.exchange, item.routing_key, item.mandatory,
                item.properties_bytes, item.body)  # fmt: skip
    method = getattr(item, "method", None)
    if method is not None:
        return (type(item).__name__, item.channel, method.name, sorted(dict(method).items()))
    return repr(item)


def _run(data: bytes, cuts: list[int], fast: bool) -> tuple[list[Any], bytes, str]:
    conn = ServerConnection(frame_max=4096)
    handshake(conn, tune=(2047, 4096, 0))
    for channel in (1, 2):
        open_channel(conn, channel)
    if not fast:
        conn._reader.next_publish = lambda accept: None  # type: ignore[method-assign]
    seen: list[Any] = []
    start = 0
    for cut in [*sorted(cuts), len(data)]:
        seen += [_describe(e) for e in conn.receive_data(data[start:cut])]
        start = cut
    return seen, conn.data_to_send(), conn.state.name


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(PIECES, max_size=12), st.data())
def test_fused_publishes_equal_frame_by_frame(pieces: list[bytes], data: Any) -> None:
    stream = b"".join(pieces)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=6))
    assert _run(stream, cuts, fast=True) == _run(stream, cuts, fast=False)


def test_the_fast_path_is_taken_for_whole_publishes() -> None:
    reader = FrameReader(4096, expect_protocol_header=False)
    reader.feed(publish(1, b"hello", frame_max=4096) + publish(1, b"x" * 5000, frame_max=4096))
    first = reader.next_publish(lambda channel: True)
    assert first is not None and (first.channel, first.body) == (1, b"hello")
    # Two body frames: left to the frame-by-frame path.
    assert reader.next_publish(lambda channel: True) is None
    assert reader.next_frame() is not None
