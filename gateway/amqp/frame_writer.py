"""Outgoing AMQP 0-9-1 frames as bytes.

Control methods go through pamqp (rare, so clarity wins). The hot frames --
basic.deliver / basic.get-ok / basic.return with their content, and basic.ack /
basic.nack for publisher confirms -- are packed by hand with pre-built
``struct`` templates. Content properties arrive *already encoded* (flags +
property list, exactly as the publisher sent them and storage kept them) and
are copied into the content header verbatim, never re-encoded.

Content functions return a list of byte strings whose concatenation is the wire
form, so a large body is sliced into frames without an extra whole-body copy.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from pamqp import base, commands

from gateway.amqp import deliver_frame, unchecked
from gateway.amqp.errors import reply_text_bytes, truncate_shortstr
from gateway.amqp.frame_reader import (
    FRAME_BODY,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_OVERHEAD,
)
from storage import twins

# Stored messages arrive as memoryview slices of one read: framing them must not copy.
Buffer = bytes | bytearray | memoryview

# The one-write deliver in use: its compiled twin when built (storage/twins.py).
deliver_one_write = twins.pick(deliver_frame.deliver_one_write)

FRAME_END_BYTES = b"\xce"
BASIC_CLASS_ID = 60
HEARTBEAT = struct.pack(">BHI", FRAME_HEARTBEAT, 0, 0) + FRAME_END_BYTES
EMPTY_PROPERTIES = b"\x00\x00"  # no flags set
WRITE_BYTES = 1 << 20  # output is written in pieces of about this size (see coalesce)

_FRAME_HEAD = struct.Struct(">BHI")
# frame head + class, weight, body size: the content header up to its properties
_CONTENT_HEAD = struct.Struct(">BHIHHQ")
_CONTENT_HEADER_FIXED = 12
_DELIVER_ID = struct.pack(">HH", 60, 60)
_GET_OK_ID = struct.pack(">HH", 60, 71)
_RETURN_ID = struct.pack(">HH", 60, 50)
_ACK_ID = struct.pack(">HH", 60, 80)
_NACK_ID = struct.pack(">HH", 60, 120)
_TAG_BIT = struct.Struct(">QB")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def _shortstr(value: str | bytes) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else value
    if len(raw) > 255:
        raise ValueError(f"shortstr longer than 255 bytes: {raw[:32]!r}...")
    return bytes((len(raw),)) + raw


def method(channel: int, frame_value: base.Frame) -> bytes:
    """Any pamqp method as one frame. Names are not checked against pamqp's ASCII pattern
    (see unchecked.py); close reply texts are cut as RabbitMQ cuts them."""
    if isinstance(frame_value, commands.Connection.Close | commands.Channel.Close):
        return _close(channel, frame_value)
    return _method_frame(channel, _U32.pack(frame_value.index), unchecked.marshal(frame_value))


def _close(channel: int, close: commands.Connection.Close | commands.Channel.Close) -> bytes:
    # By hand: a cut reply text may end inside a UTF-8 character, which pamqp cannot encode.
    args = b"".join(
        (
            _U16.pack(close.reply_code or 0),
            _shortstr(reply_text_bytes(close.reply_text or "")),
            _U16.pack(close.class_id or 0),
            _U16.pack(close.method_id or 0),
        )
    )
    return _method_frame(channel, _U32.pack(close.index), args)


def heartbeat() -> bytes:
    return HEARTBEAT


def encode_properties(properties: commands.Basic.Properties | None) -> bytes:
    """Flags + property list for server-made messages (storage keeps client bytes)."""
    if properties is None:
        return EMPTY_PROPERTIES
    return properties.marshal()


def _method_frame(channel: int, method_id: bytes, args: bytes) -> bytes:
    return b"".join(
        (_FRAME_HEAD.pack(FRAME_METHOD, channel, 4 + len(args)), method_id, args, FRAME_END_BYTES)
    )


def content_header(channel: int, body_size: int, properties_bytes: Buffer) -> bytes:
    """Class 60, weight 0, body size, then the raw property bytes."""
    head = _CONTENT_HEAD.pack(
        FRAME_HEADER,
        channel,
        _CONTENT_HEADER_FIXED + len(properties_bytes),
        BASIC_CLASS_ID,
        0,
        body_size,
    )
    return b"".join((head, properties_bytes, FRAME_END_BYTES))


def body_frames(channel: int, body: Buffer, frame_max: int) -> list[Buffer]:
    """Body split into frames of at most ``frame_max`` bytes; none for an empty body.

    A body of several frames is returned as (head, slice, end) parts per frame, the slices
    views of ``body``: framing a 100 MiB message must not copy it (``coalesce`` copies at
    most a write's worth at a time)."""
    chunk = frame_max - FRAME_OVERHEAD
    if chunk <= 0:
        raise ValueError(f"frame_max {frame_max} leaves no room for a body")
    size = len(body)
    if size <= chunk:
        if not size:
            return []
        return [b"".join((_FRAME_HEAD.pack(FRAME_BODY, channel, size), body, FRAME_END_BYTES))]
    view = memoryview(body)
    parts: list[Buffer] = []
    for start in range(0, size, chunk):
        piece = view[start : start + chunk]
        parts += (_FRAME_HEAD.pack(FRAME_BODY, channel, len(piece)), piece, FRAME_END_BYTES)
    return parts


def coalesce(parts: list[Buffer], write_bytes: int = WRITE_BYTES) -> Iterator[bytes]:
    """``parts`` joined into writes of about ``write_bytes`` (one part more at most), each
    built only when the previous one is taken: the whole output is never copied at once."""
    group: list[Buffer] = []
    size = 0
    for part in parts:
        group.append(part)
        size += len(part)
        if size >= write_bytes:
            yield b"".join(group)
            group, size = [], 0
    if group:
        yield b"".join(group)


def _with_content(
    channel: int, method_frame: bytes, properties_bytes: Buffer, body: Buffer, frame_max: int
) -> list[Buffer]:
    header = content_header(channel, len(body), properties_bytes)
    if len(body) <= frame_max - FRAME_OVERHEAD:
        # The common small message: one contiguous write of all three frames.
        parts: list[Buffer] = [method_frame, header]
        if body:
            parts += (_FRAME_HEAD.pack(FRAME_BODY, channel, len(body)), body, FRAME_END_BYTES)
        return [b"".join(parts)]
    return [method_frame + header, *body_frames(channel, body, frame_max)]


def deliver(
    channel: int,
    consumer_tag: str | bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange: str | bytes,
    routing_key: str | bytes,
    properties_bytes: Buffer,
    body: Buffer,
    frame_max: int,
) -> list[Buffer]:
    """basic.deliver + content header + body frames.

    The hot outbound frame: a body that fits one frame goes out as one string
    (deliver_frame.deliver_one_write); a larger one as views of the body."""
    frame = deliver_one_write(
        channel, consumer_tag, delivery_tag, redelivered, exchange, routing_key,
        properties_bytes, body, frame_max,
    )  # fmt: skip
    if frame is not None:
        return [frame]
    args = b"".join(
        (
            _shortstr(consumer_tag),
            _TAG_BIT.pack(delivery_tag, 1 if redelivered else 0),
            _shortstr(exchange),
            _shortstr(routing_key),
        )
    )
    method_frame = _method_frame(channel, _DELIVER_ID, args)
    return _with_content(channel, method_frame, properties_bytes, body, frame_max)


def get_ok(
    channel: int,
    delivery_tag: int,
    redelivered: bool,
    exchange: str | bytes,
    routing_key: str | bytes,
    message_count: int,
    properties_bytes: Buffer,
    body: Buffer,
    frame_max: int,
) -> list[Buffer]:
    """basic.get-ok + content header + body frames."""
    args = b"".join(
        (
            _TAG_BIT.pack(delivery_tag, 1 if redelivered else 0),
            _shortstr(exchange),
            _shortstr(routing_key),
            _U32.pack(message_count),
        )
    )
    return _with_content(
        channel, _method_frame(channel, _GET_OK_ID, args), properties_bytes, body, frame_max
    )


def return_(
    channel: int,
    reply_code: int,
    reply_text: str,
    exchange: str | bytes,
    routing_key: str | bytes,
    properties_bytes: Buffer,
    body: Buffer,
    frame_max: int,
) -> list[Buffer]:
    """basic.return (unroutable mandatory message) + content header + body frames."""
    args = b"".join(
        (
            _U16.pack(reply_code),
            _shortstr(truncate_shortstr(reply_text)),
            _shortstr(exchange),
            _shortstr(routing_key),
        )
    )
    return _with_content(
        channel, _method_frame(channel, _RETURN_ID, args), properties_bytes, body, frame_max
    )


def basic_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """Publisher confirm."""
    return _method_frame(channel, _ACK_ID, _TAG_BIT.pack(delivery_tag, 1 if multiple else 0))


def basic_nack(channel: int, delivery_tag: int, multiple: bool, requeue: bool = False) -> bytes:
    """Negative publisher confirm (bits: multiple, requeue)."""
    bits = (1 if multiple else 0) | (2 if requeue else 0)
    return _method_frame(channel, _NACK_ID, _TAG_BIT.pack(delivery_tag, bits))
