"""The fused paths (FrameReader.take_inbound over a whole read's publishes and acks,
next_publish one publish at a time) must be indistinguishable from reading the same bytes
frame by frame: same events, same bytes written, same state, whatever the stream holds (valid
publishes, acks, broken frames, other methods, bodies over the connection's max message size,
random splits)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from gateway.amqp import ServerConnection
from gateway.amqp.events import Publish
from gateway.amqp.frame_reader import FrameReader
from tests.gateway.amqp.helpers import frame, handshake, open_channel, parse, publish

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
            frame(2, commands.Basic.Ack(delivery_tag=1 << 40, multiple=True)),
            b"\x01\x00\x01\x00\x00\x00\x0d\x00\x3c\x00\x50" + b"\xfe" * 8 + b"\x01\xce",  # tag < 0
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


def _run(
    data: bytes, cuts: list[int], mode: str, max_message_size: int
) -> tuple[list[Any], bytes, str]:
    conn = ServerConnection(frame_max=4096, max_message_size=max_message_size)
    handshake(conn, tune=(2047, 4096, 0))
    for channel in (1, 2):
        open_channel(conn, channel)
    if mode != "batch":
        conn._reader.take_inbound = lambda *args: 0  # type: ignore[method-assign]
    if mode == "frames":
        conn._reader.next_publish = lambda accept: None  # type: ignore[method-assign]
    seen: list[Any] = []
    start = 0
    for cut in [*sorted(cuts), len(data)]:
        seen += [_describe(e) for e in conn.receive_data(data[start:cut])]
        start = cut
    return seen, conn.data_to_send(), conn.state.name


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(PIECES, max_size=12), st.data(), st.sampled_from([100, 1 << 20]))
def test_fused_publishes_equal_frame_by_frame(
    pieces: list[bytes], data: Any, max_message_size: int
) -> None:
    stream = b"".join(pieces)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=6))
    frames = _run(stream, cuts, "frames", max_message_size)
    assert _run(stream, cuts, "single", max_message_size) == frames
    assert _run(stream, cuts, "batch", max_message_size) == frames


def test_a_read_of_publishes_is_cut_in_one_call_up_to_the_one_in_error() -> None:
    """take_inbound stops before the publish whose body is over the max message size; that
    one closes its channel (406, as frame by frame), and the publish after it on the other
    channel still arrives."""
    conn = ServerConnection(frame_max=4096, max_message_size=10)
    handshake(conn, tune=(2047, 4096, 0))
    for channel in (1, 2):
        open_channel(conn, channel)
    conn.data_to_send()
    read = b"".join(
        [
            publish(1, b"one", routing_key="a"),
            publish(2, b"two", routing_key="b"),
            publish(1, b"x" * 11),
            publish(2, b"three", routing_key="c"),
        ]
    )
    calls: list[int] = []
    take = conn._reader.take_inbound

    def counted(*args: Any) -> int:
        calls.append(taken := take(*args))
        return taken

    conn._reader.take_inbound = counted  # type: ignore[method-assign]
    events = conn.receive_data(read)
    published = [(e.channel, e.routing_key, e.body) for e in events if isinstance(e, Publish)]
    assert published == [(1, "a", b"one"), (2, "b", b"two"), (2, "c", b"three")]
    assert calls[0] == 2  # the first two in one call
    sent = dict(parse(conn.data_to_send()))
    assert isinstance(sent[1], commands.Channel.Close)
    assert sent[1].reply_code == 406


def test_the_fast_path_is_taken_for_whole_publishes() -> None:
    reader = FrameReader(4096, expect_protocol_header=False)
    reader.feed(publish(1, b"hello", frame_max=4096) + publish(1, b"x" * 5000, frame_max=4096))
    first = reader.next_publish(lambda channel: True)
    assert first is not None and (first.channel, first.body) == (1, b"hello")
    # Two body frames: left to the frame-by-frame path.
    assert reader.next_publish(lambda channel: True) is None
    assert reader.next_frame() is not None
