"""basic.deliver with its content as one write: the hot outbound frame.

Kept apart from frame_writer so that it has a compiled twin:
``speedups/mqgw_speedups/deliver_frame.pyx`` builds the same bytes in C, and ``twins.twin``
picks it when it is built (``MQGW_PURE_PYTHON=1`` forces this module). This module is the
reference: both give the same results, which tests/gateway/amqp/test_twins.py checks on
random input.

Only the common message is handled here, one whose body fits one frame and whose names fit
a shortstr; anything else is None, and frame_writer.deliver frames it (several body frames
as views of the body, or the error for a name over 255 bytes). Self-contained (stdlib only).
"""

from __future__ import annotations

import struct

# Stored messages arrive as memoryview slices of one read: framing them must not copy.
Buffer = bytes | bytearray | memoryview

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_END = 0xCE
FRAME_END_BYTES = b"\xce"
FRAME_OVERHEAD = 8  # frame head + frame-end octet
BASIC_CLASS_ID = 60
CONTENT_HEADER_FIXED = 12  # class id, weight, body size

_DELIVER_HEAD = struct.Struct(">BHIHH")  # frame head + class, method
_TAG_BIT_LEN = struct.Struct(">QBB")  # delivery tag, redelivered, exchange length
_END_CONTENT_HEAD = struct.Struct(">BBHIHHQ")  # frame end + content header up to properties
_END_FRAME_HEAD = struct.Struct(">BBHI")  # frame end + frame head
_LENGTHS = [bytes((n,)) for n in range(256)]

_consumer_tags: dict[str | bytes, bytes] = {}  # consumer tag -> its shortstr
_CONSUMER_TAGS_MAX = 65536


def _consumer_tag_shortstr(consumer_tag: str | bytes) -> bytes | None:
    encoded = consumer_tag.encode("utf-8") if isinstance(consumer_tag, str) else consumer_tag
    if len(encoded) > 255:
        return None  # frame_writer raises for it: nothing cached
    if len(_consumer_tags) >= _CONSUMER_TAGS_MAX:
        _consumer_tags.clear()
    tag = _consumer_tags[consumer_tag] = _LENGTHS[len(encoded)] + encoded
    return tag


def deliver_one_write(
    channel: int,
    consumer_tag: str | bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange: str | bytes,
    routing_key: str | bytes,
    properties_bytes: Buffer,
    body: Buffer,
    frame_max: int,
) -> bytes | None:
    """basic.deliver + content header + body frame as one string, or None when the message
    needs more than one body frame or a name is over 255 bytes.

    Four struct packs and the variable parts, joined once (the consumer tag's shortstr is
    cached)."""
    tag = _consumer_tags.get(consumer_tag)
    if tag is None:
        tag = _consumer_tag_shortstr(consumer_tag)
        if tag is None:
            return None
    if not isinstance(exchange, bytes):
        exchange = exchange.encode("utf-8")
    if not isinstance(routing_key, bytes):
        routing_key = routing_key.encode("utf-8")
    body_size = len(body)
    if len(exchange) > 255 or len(routing_key) > 255 or body_size > frame_max - FRAME_OVERHEAD:
        return None
    method_size = 4 + len(tag) + 11 + len(exchange) + len(routing_key)
    parts: list[Buffer] = [
        _DELIVER_HEAD.pack(FRAME_METHOD, channel, method_size, 60, 60),
        tag,
        _TAG_BIT_LEN.pack(delivery_tag, 1 if redelivered else 0, len(exchange)),
        exchange,
        _LENGTHS[len(routing_key)],
        routing_key,
        _END_CONTENT_HEAD.pack(
            FRAME_END,
            FRAME_HEADER,
            channel,
            CONTENT_HEADER_FIXED + len(properties_bytes),
            BASIC_CLASS_ID,
            0,
            body_size,
        ),
        properties_bytes,
    ]
    if body_size:
        parts += (_END_FRAME_HEAD.pack(FRAME_END, FRAME_BODY, channel, body_size), body)
    parts.append(FRAME_END_BYTES)
    return b"".join(parts)
