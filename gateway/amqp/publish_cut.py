"""Cutting a whole basic.publish (method, content header, one body frame) out of the input.

The hot inbound path, kept apart from frame_reader so that it has a compiled twin:
``speedups/mqgw_speedups/publish_cut.pyx`` does the same in C, and ``twins.twin`` picks it
when it is built (``MQGW_PURE_PYTHON=1`` forces this module). This module is the reference:
both give the same results, which tests/amqp/test_twins.py checks on random input.

Self-contained (stdlib only): the compiled twin imports ``PublishFrames`` from here.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

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

    None unless all three frames are complete, well-shaped and on one channel that
    ``accept``s them (asked last, once everything else holds): an oversized or malformed
    frame, a bad frame-end, a content header of another class or weight, several body
    frames are left for the frame-by-frame path, which reports them. The three frame heads
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
    if (
        kind != FRAME_BODY
        or number != channel
        or frame_size != body_size
        or buf[body_end] != FRAME_END
        or not accept(channel)
    ):
        return None
    fields = (
        channel,
        bytes(buf[method_start:method_end]),
        bytes(buf[head_at + FRAME_HEADER_SIZE + _CONTENT_HEADER_FIXED : head_end]),
        bytes(buf[body_start:body_end]),
    )
    frames: PublishFrames = _make_tuple(PublishFrames, fields)  # no Python-level __new__
    return body_end + 1, frames
