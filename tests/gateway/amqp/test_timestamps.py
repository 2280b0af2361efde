"""AMQP timestamps are 64-bit unsigned integers (RabbitMQ stores and delivers any of them);
a Python datetime holds years 1 to 9999 only, and pamqp reads a value above 2^32 as
milliseconds. Properties whose timestamp, or a header's, lies
beyond that decode all the same (the timestamp read as absent, a header's as an integer), and
the bytes encoded again after a rewrite keep the timestamp as sent."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands

from gateway.amqp.events import decode_properties
from gateway.amqp.frame_writer import encode_properties
from gateway.amqp.property_bytes import (
    MAX_DATETIME_S,
    TIMESTAMP,
    join_properties,
    keep_timestamp,
    split_properties,
    timestamp_of,
)

U64 = st.integers(0, 2**64 - 1)


def _with_timestamp(base: bytes, seconds: int) -> bytes:
    fields = split_properties(base)
    fields[TIMESTAMP] = struct.pack(">Q", seconds)
    return join_properties(fields)


def _header_table(seconds: int) -> bytes:
    entry = b"\x04when" + b"T" + struct.pack(">Q", seconds)
    nested = b"\x04deep" + b"A" + struct.pack(">I", 9) + b"T" + struct.pack(">Q", seconds)
    body = entry + nested
    return struct.pack(">I", len(body)) + body


@given(seconds=U64, in_header=st.booleans())
def test_any_64_bit_timestamp_decodes(seconds: int, in_header: bool) -> None:
    base = encode_properties(commands.Basic.Properties(reply_to="r", delivery_mode=2))
    raw = _with_timestamp(base, seconds)
    if in_header:
        fields = split_properties(raw)
        fields[0x2000] = _header_table(seconds)  # HEADERS
        raw = join_properties(fields)
    decoded = decode_properties(raw)
    assert decoded.reply_to == "r" and decoded.delivery_mode == 2
    assert timestamp_of(raw) == seconds
    if seconds <= 0xFFFFFFFF:  # above, pamqp reads milliseconds: only timestamp_of is exact
        assert decoded.timestamp is not None
        assert int(decoded.timestamp.timestamp()) == seconds
    elif seconds >= (MAX_DATETIME_S + 1) * 1000:
        assert decoded.timestamp is None  # beyond a datetime: read as absent, kept as sent
    if in_header:
        headers = decoded.headers
        assert headers is not None
        when = headers["when"]
        if isinstance(when, int):  # beyond a datetime: the 64-bit integer (as a long long)
            assert when % 2**64 == seconds
        elif seconds <= 0xFFFFFFFF:
            assert int(when.timestamp()) == seconds


@given(seconds=U64)
def test_a_rewrite_keeps_the_timestamp_as_sent(seconds: int) -> None:
    sent = _with_timestamp(encode_properties(commands.Basic.Properties(reply_to="a")), seconds)
    properties = decode_properties(sent)
    properties.reply_to = "amq.rabbitmq.reply-to.xyz"  # what the direct reply-to rewrite does
    again = keep_timestamp(sent, encode_properties(properties))
    assert timestamp_of(again) == seconds
    assert decode_properties(again).reply_to == "amq.rabbitmq.reply-to.xyz"


def test_no_timestamp_stays_none() -> None:
    sent = encode_properties(commands.Basic.Properties(content_type="text/plain"))
    assert timestamp_of(sent) is None
    assert keep_timestamp(sent, sent) == sent
