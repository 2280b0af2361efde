"""Cutting a whole basic.publish (method, content header, one body frame) out of the input,
one at a time (``cut_publish``), or a whole read's worth of publishes and basic.acks in one
call (``cut_inbound``).

The hot inbound path, kept apart from frame_reader so that it has a compiled twin:
``speedups/mqgw_speedups/publish_cut.pyx`` does the same in C, and ``twins.twin`` picks it
when it is built (``MQGW_PURE_PYTHON=1`` forces this module). This module is the reference:
both give the same results, which tests/gateway/amqp/test_twins.py checks on random input.

``properties_well_formed`` checks a content header's property bytes as RabbitMQ 3.10's decoder
reads them (rabbit_framing_amqp_0_9_1:decode_properties, rabbit_binary_parser:parse_table) in
one bounds-checked pass: what it refuses, RabbitMQ's channel crashes on (the connection closes
with INTERNAL_ERROR) and stores nothing. It is no UTF-8 check: RabbitMQ passes a shortstr,
a table key or a longstr of any bytes through, and the two low flag bits are ignored.

Self-contained (stdlib only): the compiled twin imports ``PublishFrames`` from here.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple, TypeVar

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_END = 0xCE
FRAME_HEADER_SIZE = 7  # type octet, channel u16, size u32

_FRAME_HEAD = struct.Struct(">BHI")
_PUBLISH_INDEX = 0x003C0028  # class 60 (basic), method 40 (publish)
_METHOD_HEAD = struct.Struct(">BHII")  # frame head + method index
_CONTENT_FRAME_HEAD = struct.Struct(">BHIHHQ")  # frame head + class id, weight, body size
_CONTENT_HEADER_FIXED = 12  # class id, weight, body size
_EXCHANGE_AT = 6  # basic.publish: class, method, a deprecated u16 ticket, then the exchange
_ACK_INDEX = 0x003C0050  # class 60 (basic), method 80 (ack)
_ACK_FIELDS = struct.Struct(">qB")  # delivery tag (signed, as pamqp reads it), the bits
_ACK_PAYLOAD = 4 + _ACK_FIELDS.size
_ACK_FRAME = FRAME_HEADER_SIZE + _ACK_PAYLOAD + 1
T = TypeVar("T")


class PublishFrames(NamedTuple):
    """basic.publish + content header + one body frame, cut in one step: the method's
    payload, the header's property bytes (after class, weight and body size) and the body."""

    channel: int
    method: bytes
    properties: bytes
    body: bytes


_make_tuple = tuple.__new__


def cut_publish(
    buf: bytearray, pos: int, frame_max: int, accept: Callable[[int], bool]
) -> tuple[int, PublishFrames] | None:
    """The publish starting at ``buf[pos]`` and the position after it, or None.

    None unless all three frames are complete, well-shaped, with well-formed properties and
    on one channel that ``accept``s them (asked last, once everything else holds): an
    oversized or malformed frame, a bad frame-end, a content header of another class or
    weight or with undecodable properties, several body frames are left for the
    frame-by-frame path, which reports them. The three frame heads
    are read with one struct call each: this runs once per message."""
    size = len(buf)
    if pos + 11 > size:
        return None
    kind, channel, method_size, method_id = _METHOD_HEAD.unpack_from(buf, pos)
    method_start = pos + FRAME_HEADER_SIZE
    method_end = method_start + method_size
    if (
        kind != FRAME_METHOD
        or method_id != _PUBLISH_INDEX
        or method_size > frame_max
        or method_end + 1 + _CONTENT_FRAME_HEAD.size > size
        or buf[method_end] != FRAME_END
    ):
        return None
    head_at = method_end + 1
    kind, number, head_size, class_id, weight, body_size = _CONTENT_FRAME_HEAD.unpack_from(
        buf, head_at
    )
    head_end = head_at + FRAME_HEADER_SIZE + head_size
    if (
        kind != FRAME_HEADER
        or number != channel
        or head_size < _CONTENT_HEADER_FIXED
        or head_size > frame_max
        or class_id != 60
        or weight != 0
        or body_size == 0
        or body_size > frame_max
        or head_end + 1 + FRAME_HEADER_SIZE + body_size >= size
        or buf[head_end] != FRAME_END
    ):
        return None
    body_at = head_end + 1
    kind, number, frame_size = _FRAME_HEAD.unpack_from(buf, body_at)
    body_start = body_at + FRAME_HEADER_SIZE
    body_end = body_start + body_size
    if kind != FRAME_BODY or number != channel or frame_size != body_size:
        return None
    properties = bytes(buf[head_at + FRAME_HEADER_SIZE + _CONTENT_HEADER_FIXED : head_end])
    if buf[body_end] != FRAME_END or not properties_well_formed(properties) or not accept(channel):
        return None
    fields = (
        channel,
        bytes(buf[method_start:method_end]),
        properties,
        bytes(buf[body_start:body_end]),
    )
    frames: PublishFrames = _make_tuple(PublishFrames, fields)  # no Python-level __new__
    return body_end + 1, frames


def cut_inbound(
    buf: bytearray,
    pos: int,
    frame_max: int,
    max_body: int,
    accept: Callable[[int], bool],
    make_publish: Callable[[int, str, str, bool, bool, bytes, bytes], T],
    make_ack: Callable[[int, int, bool], T],
    out: list[T],
) -> int:
    """The hot inbound frames from ``buf[pos]`` on, one after the other: every publish
    ``cut_publish`` takes, appended to ``out`` as ``make_publish(channel, exchange,
    routing_key, mandatory, immediate, properties, body)``, and every basic.ack ``cut_ack``
    takes, as ``make_ack(channel, delivery_tag, multiple)``; returns the position after the
    last.

    A whole socket read in one call: it stops, leaving the rest for the one-publish and the
    frame-by-frame paths (which report what is wrong), at the first frame that is neither,
    at a publish whose body is over ``max_body`` or whose method does not decode
    (``publish_head``). ``accept`` is asked once per channel: nothing between two frames of
    one read changes a channel's state, since their events are handled only after the read."""
    accepted: set[int] = set()

    def accept_once(channel: int) -> bool:
        if channel in accepted:
            return True
        if accept(channel):
            accepted.add(channel)
            return True
        return False

    while True:
        cut = cut_publish(buf, pos, frame_max, accept_once)
        if cut is not None:
            end, (channel, method, properties, body) = cut
            head = publish_head(method)
            if head is None or len(body) > max_body:
                break
            out.append(make_publish(channel, *head, properties, body))
            pos = end
            continue
        ack = cut_ack(buf, pos, frame_max, accept_once)
        if ack is None:
            break
        pos, (channel, delivery_tag, multiple) = ack
        out.append(make_ack(channel, delivery_tag, multiple))
    return pos


def cut_ack(
    buf: bytearray, pos: int, frame_max: int, accept: Callable[[int], bool]
) -> tuple[int, tuple[int, int, bool]] | None:
    """The basic.ack frame at ``buf[pos]`` and the position after it, or None: a method frame
    whose payload is the ack's 13 bytes (ids, u64 delivery tag, the bits; multiple is the
    lowest, as pamqp reads it), well ended, on a channel that ``accept``s it (asked last)."""
    if pos < 0 or pos + _ACK_FRAME > len(buf):
        return None
    kind, channel, size, index = _METHOD_HEAD.unpack_from(buf, pos)
    if (
        kind != FRAME_METHOD
        or index != _ACK_INDEX
        or size != _ACK_PAYLOAD
        or size > frame_max
        or buf[pos + _ACK_FRAME - 1] != FRAME_END
        or not accept(channel)
    ):
        return None
    delivery_tag, bits = _ACK_FIELDS.unpack_from(buf, pos + _METHOD_HEAD.size)
    return pos + _ACK_FRAME, (channel, delivery_tag, bits & 1 == 1)


def publish_head(method: bytes) -> tuple[str, str, bool, bool] | None:
    """basic.publish's payload (class and method ids, a u16 ticket, the exchange and routing
    key as shortstrs, the bits): exchange, routing key, mandatory, immediate; None if the
    shortstrs overrun the payload or are not UTF-8 (channel.decode_publish's FrameError)."""
    size = len(method)
    if size <= _EXCHANGE_AT:
        return None
    start = _EXCHANGE_AT + 1
    end = start + method[_EXCHANGE_AT]
    if end >= size:
        return None
    key_start = end + 1
    key_end = key_start + method[end]
    if key_end >= size:
        return None
    try:
        exchange = method[start:end].decode("utf-8")
        routing_key = method[key_start:key_end].decode("utf-8")
    except UnicodeDecodeError:
        return None
    bits = method[key_end]
    return exchange, routing_key, bits & 1 == 1, bits & 2 == 2


# Property flag bits in wire order and the size class of each property: 0 a shortstr, -1 a
# field table, else a fixed size (octet, timestamp). The two low bits are not properties.
_PROPERTY_KINDS = (
    (0x8000, 0), (0x4000, 0), (0x2000, -1), (0x1000, 1), (0x0800, 1), (0x0400, 0),
    (0x0200, 0), (0x0100, 0), (0x0080, 0), (0x0040, 8), (0x0020, 0), (0x0010, 0),
    (0x0008, 0), (0x0004, 0),
)  # fmt: skip
_PROPERTY_BITS = 0xFFFC
# Field-value tags RabbitMQ knows with a fixed size; S x F A carry a u32 length.
_FIXED_VALUE = {ord(tag): size for tag, size in (
    ("t", 1), ("b", 1), ("B", 1), ("s", 2), ("u", 2), ("I", 4), ("i", 4), ("f", 4),
    ("l", 8), ("L", 8), ("d", 8), ("T", 8), ("D", 5), ("V", 0),
)}  # fmt: skip
_LONG_VALUE = frozenset(b"SxFA")
_FLOATS = frozenset(b"fd")
_NESTED = frozenset(b"FA")
_TAG_FLOAT, _TAG_TABLE = ord("f"), ord("F")


def properties_well_formed(data: bytes) -> bool:
    """Whether RabbitMQ 3.10 decodes these property bytes (flags + values): every present
    property within the bytes and nothing after the last, every field table well-formed."""
    size = len(data)
    if size < 2:
        return False
    flags = (data[0] << 8 | data[1]) & _PROPERTY_BITS
    pos = 2
    for bit, kind in _PROPERTY_KINDS:
        if not flags:
            break
        if not flags & bit:
            continue
        flags ^= bit
        if pos >= size:
            return False
        if kind == 0:
            pos += 1 + data[pos]
        elif kind > 0:
            pos += kind
        else:
            end = pos + 4 + int.from_bytes(data[pos : pos + 4], "big")
            if end > size or not _table_well_formed(data, pos + 4, end):
                return False
            pos = end
    return pos == size


def _table_well_formed(data: bytes, pos: int, end: int) -> bool:
    """The entries of the table ``data[pos:end]``, nested tables and arrays included, walked
    with a stack of their ends (RabbitMQ takes any depth: no recursion limit here)."""
    stack = [(end, True)]  # (where a table or array ends, whether it is a table)
    while stack:
        end, is_table = stack[-1]
        if pos == end:
            stack.pop()
            continue
        if is_table:
            pos += 1 + data[pos]  # the key: any bytes
            if pos >= end:
                return False
        tag = data[pos]
        pos += 1
        fixed = _FIXED_VALUE.get(tag)
        if fixed is not None:
            if pos + fixed > end or (tag in _FLOATS and not _finite(data, pos, tag)):
                return False
            pos += fixed
        elif tag in _LONG_VALUE:
            if pos + 4 > end:
                return False
            value_end = pos + 4 + int.from_bytes(data[pos : pos + 4], "big")
            if value_end > end:
                return False
            if tag in _NESTED:
                stack.append((value_end, tag == _TAG_TABLE))
                pos += 4
            else:
                pos = value_end
        else:
            return False  # a tag RabbitMQ does not know
    return True


def _finite(data: bytes, pos: int, tag: int) -> bool:
    """Erlang's float match fails on an infinity or a NaN (all exponent bits set)."""
    if data[pos] & 0x7F != 0x7F:
        return True
    second = data[pos + 1]
    return not (second & 0x80 if tag == _TAG_FLOAT else second & 0xF0 == 0xF0)
