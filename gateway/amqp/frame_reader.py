"""Incremental AMQP 0-9-1 frame decoder: bytes in, raw frames out.

``feed()`` appends bytes; iterating yields complete frames. The reader only
checks framing (protocol header, frame size, frame-end octet, frame type and the
minimum payload shape per type, as rabbit_command_assembler:analyze_frame does);
decoding methods is the connection's job. pamqp's ``frame.unmarshal`` raises on a
partial frame, so we read the 7-byte frame header ourselves first and wait until
the whole frame is buffered.

Limits: a frame announcing a payload larger than ``frame_max`` is rejected
from its header alone, so an incomplete frame never holds more than
``frame_max + 8`` bytes here.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from gateway.amqp import publish_cut
from gateway.amqp.errors import FrameError, frame_error_detail
from storage import twins

# The publish cutter in use: its compiled twin when built (storage/twins.py).
cut_publish = twins.pick(publish_cut.cut_publish)
cut_inbound = twins.pick(publish_cut.cut_inbound)
PublishFrames = publish_cut.PublishFrames  # what next_publish returns

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_HEADER_SIZE = 7
FRAME_OVERHEAD = 8  # header + frame-end octet

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
# AMQP 0-9 header; RabbitMQ treats it as 0-9-1 (rabbit_reader:version_negotiation).
PROTOCOL_HEADER_0_9 = b"AMQP\x01\x01\x00\x09"

_FRAME_HEAD = struct.Struct(">BHI")
T = TypeVar("T")
_MIN_PAYLOAD = {FRAME_METHOD: 4, FRAME_HEADER: 12, FRAME_BODY: 0}


@dataclass(frozen=True, slots=True)
class ProtocolHeaderReceived:
    """The first 8 bytes of the connection."""

    raw: bytes

    @property
    def supported(self) -> bool:
        return self.raw in (PROTOCOL_HEADER, PROTOCOL_HEADER_0_9)


class RawFrame(NamedTuple):
    """A complete, well-shaped frame whose payload is not decoded yet."""

    frame_type: int
    channel: int
    payload: bytes


class FrameReader:
    """Buffers input and cuts it into frames; raises FrameError on bad framing."""

    def __init__(self, frame_max: int, expect_protocol_header: bool = True) -> None:
        self.frame_max = frame_max
        self.expect_protocol_header = expect_protocol_header
        # Set when framing is lost (oversized frame, bad frame-end): no later
        # byte can be trusted to start a frame, so the reader stops for good.
        self.broken = False
        self._buf = bytearray()
        self._pos = 0  # consumed prefix of _buf, dropped on the next feed

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf) - self._pos

    def feed(self, data: bytes) -> None:
        if self.broken:
            return
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def __iter__(self) -> Iterator[RawFrame | ProtocolHeaderReceived]:
        while (item := self.next_frame()) is not None:
            yield item

    def next_publish(self, accept: Callable[[int], bool]) -> PublishFrames | None:
        """The fast path for the hot inbound message: basic.publish, its content header and a
        single body frame, all complete in the buffer and on one channel that ``accept``s
        them (publish_cut.cut_publish). Anything else, or anything unusual, is None and left
        for next_frame, which validates and reports it frame by frame."""
        if self.broken or self.expect_protocol_header:
            return None
        cut = cut_publish(self._buf, self._pos, self.frame_max, accept)
        if cut is None:
            return None
        self._pos, frames = cut
        return frames

    def take_inbound(
        self,
        accept: Callable[[int], bool],
        max_body: int,
        make_publish: Callable[[int, str, str, bool, bool, bytes, bytes], T],
        make_ack: Callable[[int, int, bool], T],
        out: list[T],
    ) -> int:
        """The fast path over a whole read: every publish next_publish would cut and every
        basic.ack, one after the other, made into events in ``out``
        (publish_cut.cut_inbound); returns how many. It stops where next_publish and the
        frame-by-frame path must take over: a publish they report an error for, or any other
        frame."""
        if self.broken or self.expect_protocol_header:
            return 0
        before = len(out)
        self._pos = cut_inbound(
            self._buf, self._pos, self.frame_max, max_body, accept, make_publish, make_ack, out
        )
        return len(out) - before

    def next_frame(self) -> RawFrame | ProtocolHeaderReceived | None:
        """The next complete frame, or None when more bytes are needed."""
        if self.broken:
            return None
        buf, pos = self._buf, self._pos
        available = len(buf) - pos
        if self.expect_protocol_header:
            if available < len(PROTOCOL_HEADER):
                return None
            self.expect_protocol_header = False
            self._pos = pos + len(PROTOCOL_HEADER)
            return ProtocolHeaderReceived(bytes(buf[pos : self._pos]))
        if available < FRAME_HEADER_SIZE:
            return None
        frame_type, channel, size = _FRAME_HEAD.unpack_from(buf, pos)
        # RabbitMQ tolerates size == frame_max (clients are often off by 8).
        if size > self.frame_max:
            self.broken = True
            reason = f"{{frame_too_large,{size},{self.frame_max - FRAME_OVERHEAD}}}"
            raise FrameError(frame_error_detail(frame_type, b"", reason))
        end = pos + FRAME_HEADER_SIZE + size
        if available < FRAME_HEADER_SIZE + size + 1:
            return None
        payload = bytes(buf[pos + FRAME_HEADER_SIZE : end])
        marker = buf[end]
        self._pos = end + 1
        if marker != FRAME_END:
            self.broken = True
            reason = f"{{invalid_frame_end_marker,{marker}}}"
            raise FrameError(frame_error_detail(frame_type, payload, reason))
        if frame_type == FRAME_HEARTBEAT:
            if payload:
                raise FrameError(frame_error_detail(frame_type, payload, "unknown_frame"))
        elif len(payload) < _MIN_PAYLOAD.get(frame_type, 1 << 40):
            raise FrameError(frame_error_detail(frame_type, payload, "unknown_frame"))
        return RawFrame(frame_type, channel, payload)
