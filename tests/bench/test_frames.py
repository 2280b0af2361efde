"""The load generator's frames: templates decode with pamqp; the hand parser agrees with pamqp."""

from __future__ import annotations

import itertools
import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands, frame
from pamqp import header as pheader

from bench.load.frames import (
    STAMP,
    InboundParser,
    PublishTemplate,
    basic_ack,
    decode,
    deliver_frames,
    encode,
    method_id,
)
from bench.load.publisher import _Confirms

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40).filter(
    lambda s: len(s.encode()) <= 255
)
exchanges = st.from_regex(r"[a-zA-Z0-9_.:-]{0,127}", fullmatch=True)  # pamqp's domain
u64 = st.integers(0, 2**64 - 1)


def unmarshal_all(data: bytes) -> list[tuple[int, object]]:
    out = []
    while data:
        size = struct.unpack_from(">I", data, 3)[0]
        consumed, channel, value = frame.unmarshal(data[: size + 8])
        out.append((channel, value))
        data = data[consumed:]
    return out


@given(
    channel=st.integers(1, 2047),
    exchange=exchanges,
    routing_key=names,
    body_bytes=st.integers(STAMP.size, 4096),
    persistent=st.booleans(),
    seq=u64,
    sent_ns=u64,
)
def test_publish_template_round_trips_through_pamqp(
    channel: int,
    exchange: str,
    routing_key: str,
    body_bytes: int,
    persistent: bool,
    seq: int,
    sent_ns: int,
) -> None:
    template = PublishTemplate.build(channel, exchange, routing_key, body_bytes, persistent)
    (c1, method), (c2, head), (c3, body) = unmarshal_all(template.render(seq, sent_ns))
    assert c1 == c2 == c3 == channel
    assert isinstance(method, commands.Basic.Publish)
    assert (method.exchange, method.routing_key) == (exchange, routing_key)
    assert isinstance(head, pheader.ContentHeader)
    assert head.body_size == body_bytes
    assert head.properties.delivery_mode == (2 if persistent else 1)
    assert len(body.value) == body_bytes
    assert STAMP.unpack_from(body.value) == (seq, sent_ns)


def test_basic_ack_is_what_pamqp_encodes() -> None:
    assert basic_ack(7, 123456, True) == encode(commands.Basic.Ack(123456, True), 7)
    assert basic_ack(1, 1, False) == encode(commands.Basic.Ack(1, False), 1)


deliveries = st.tuples(
    st.integers(1, 2047),  # channel
    names,  # consumer tag
    st.integers(1, 2**63 - 1),  # delivery tag (pamqp encodes it signed)
    st.booleans(),  # redelivered
    exchanges,
    names,  # routing key
    st.one_of(st.binary(max_size=15), st.tuples(u64, u64, st.binary(max_size=300))),
)
confirms = st.tuples(st.integers(1, 2047), st.integers(1, 2**63 - 1), st.booleans(), st.booleans())


@settings(max_examples=200)
@given(
    items=st.lists(st.one_of(deliveries, confirms, st.just("close")), max_size=12),
    frame_max=st.sampled_from([40, 64, 4096, 131072]),
    cuts=st.lists(st.integers(0, 10_000), max_size=8),
)
def test_parser_agrees_with_pamqp(items: list[object], frame_max: int, cuts: list[int]) -> None:
    """Deliveries (bodies split over frames when frame_max is small), confirms and other
    methods, with the byte stream cut at arbitrary points."""
    stream, want_deliveries, want_confirms, want_others = [], [], [], []
    for item in items:
        if item == "close":
            close = commands.Channel.Close(406, "PRECONDITION_FAILED", 60, 40)
            stream.append(encode(close, 3))
            want_others.append((3, method_id(commands.Channel.Close), close.reply_text))
        elif isinstance(item, tuple) and len(item) == 7:
            channel, ctag, dtag, redelivered, exchange, key, payload = item
            if isinstance(payload, tuple):
                seq, sent_ns, rest = payload
                body, stamp = STAMP.pack(seq, sent_ns) + rest, (seq, sent_ns)
            else:
                body, stamp = payload, (-1, 0)
            reference = deliver_frames(
                channel, ctag, dtag, redelivered, exchange, key, body, frame_max
            )
            decoded = [v for _, v in unmarshal_all(reference)]  # pamqp's reading of them
            deliver = decoded[0]
            assert isinstance(deliver, commands.Basic.Deliver)
            content = b"".join(v.value for v in decoded[2:])
            assert content == body
            want_deliveries.append(
                (channel, deliver.consumer_tag.encode(), deliver.delivery_tag,
                 deliver.redelivered, *stamp)
            )  # fmt: skip
            stream.append(reference)
        else:
            assert isinstance(item, tuple)
            channel, tag, multiple, nack = item
            method = (
                commands.Basic.Nack(tag, multiple) if nack else commands.Basic.Ack(tag, multiple)
            )
            stream.append(encode(method, channel))
            want_confirms.append((channel, tag, multiple, nack))
    data = b"".join(stream)
    parser = InboundParser()
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    for lo, hi in itertools.pairwise(points):
        parser.feed(data[lo:hi])
    assert parser.deliveries == want_deliveries
    assert parser.confirms == want_confirms
    got_others = [(ch, cm, decode(whole).reply_text) for ch, cm, whole in parser.others]
    assert got_others == want_others
    assert not parser.buffer


def test_confirm_counting_mixes_single_and_multiple_acks() -> None:
    confirms = _Confirms()
    confirms.apply([(1, 2, False, False), (1, 3, False, True)])
    assert (confirms.count, confirms.nacked) == (2, 1)
    confirms.apply([(1, 1, False, False)])  # 1..3 now contiguous
    assert (confirms.upto, confirms.singles) == (3, set())
    confirms.apply([(1, 6, False, False), (1, 5, True, False)])
    assert (confirms.count, confirms.upto) == (6, 6)
