"""AMQP frames for the load generator: pre-encoded templates out, a hand parser in.

Control frames (handshake, declares, consume…) are encoded once with pamqp; they are not
per message. A publish is method + content header + body frames whose bytes never change
except 16 bytes at the start of the body (sequence number, send time), so a template keeps
the bytes before and after them and a publish costs one ``struct.pack`` and a join.

The inbound parser only understands what the hot path needs — basic.deliver (consumer tag,
delivery tag, and the body's seq/timestamp) and basic.ack/nack (confirms) — and hands every
other method frame back whole, for pamqp to decode off the hot path.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from pamqp import body as pbody
from pamqp import commands, frame
from pamqp import header as pheader

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = 0xCE
STAMP = struct.Struct(">QQ")  # body prefix: sequence number, send time (monotonic ns)
STAMP_BYTES = STAMP.size

_FRAME_HEAD = struct.Struct(">BHI")
_CLASS_METHOD = struct.Struct(">HH")
_U64 = struct.Struct(">Q")
_TAG_AND_BITS = struct.Struct(">QB")
_BASIC_ACK = struct.Struct(">BHIHHQBB")  # frame head, class, method, tag, bits, frame end

# class/method ids as one int: (class << 16) | method
DELIVER = (60 << 16) | 60
CONFIRM_ACK = (60 << 16) | 80
CONFIRM_NACK = (60 << 16) | 120


def encode(method: Any, channel: int = 0) -> bytes:
    """One method frame, encoded with pamqp (control frames only)."""
    data: bytes = frame.marshal(method, channel)
    return data


def basic_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """basic.ack packed directly: it is sent once per received batch, so it stays cheap."""
    return _BASIC_ACK.pack(1, channel, 13, 60, 80, delivery_tag, int(multiple), FRAME_END)


@dataclass(frozen=True)
class PublishTemplate:
    """The bytes of one publish except the stamp: ``prefix + STAMP.pack(seq, ts) + suffix``."""

    prefix: bytes
    suffix: bytes

    @classmethod
    def build(
        cls, channel: int, exchange: str, routing_key: str, body_bytes: int, persistent: bool
    ) -> PublishTemplate:
        if body_bytes < STAMP_BYTES:
            raise ValueError(f"bodies need at least {STAMP_BYTES} bytes for seq and timestamp")
        method = frame.marshal(
            commands.Basic.Publish(exchange=exchange, routing_key=routing_key), channel
        )
        props = commands.Basic.Properties(delivery_mode=2 if persistent else 1)
        header = frame.marshal(pheader.ContentHeader(0, body_bytes, props), channel)
        body_head = _FRAME_HEAD.pack(3, channel, body_bytes)
        padding = b"x" * (body_bytes - STAMP_BYTES)
        return cls(method + header + body_head, padding + bytes([FRAME_END]))

    def render(self, seq: int, sent_ns: int) -> bytes:
        """A whole publish (tests and one-offs; the hot loop inlines this)."""
        return self.prefix + STAMP.pack(seq, sent_ns) + self.suffix


def deliver_frames(
    channel: int,
    consumer_tag: str,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    body: bytes,
    frame_max: int = 131072,
) -> bytes:
    """basic.deliver + header + body frame(s) as a server sends them, encoded by pamqp."""
    deliver = commands.Basic.Deliver(consumer_tag, delivery_tag, redelivered, exchange, routing_key)
    out = [frame.marshal(deliver, channel)]
    props = commands.Basic.Properties(delivery_mode=2)
    out.append(frame.marshal(pheader.ContentHeader(0, len(body), props), channel))
    chunk = frame_max - 8
    for start in range(0, len(body), chunk):
        out.append(frame.marshal(pbody.ContentBody(body[start : start + chunk]), channel))
    return b"".join(out)


# (channel, consumer tag, delivery tag, redelivered, seq, sent_ns); seq = -1 if no stamp
Delivery = tuple[int, bytes, int, bool, int, int]
# (channel, delivery tag, multiple, nack)
Confirm = tuple[int, int, bool, bool]
# (channel, class/method id, the whole frame) for pamqp to decode
Other = tuple[int, int, bytes]


class InboundParser:
    """Splits received bytes into deliveries, confirms and other method frames.

    ``feed`` appends to the output lists; the caller clears them after handling. Frames may be
    split anywhere across ``feed`` calls.
    """

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.deliveries: list[Delivery] = []
        self.confirms: list[Confirm] = []
        self.others: list[Other] = []
        # A deliver whose body has not started yet: (channel, ctag, dtag, redelivered)
        self._pending: tuple[int, bytes, int, bool] | None = None
        self._body_left = 0

    def feed(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        end = len(buf)
        pos = 0
        unpack_head = _FRAME_HEAD.unpack_from
        deliveries = self.deliveries
        while end - pos >= 7:
            kind, channel, size = unpack_head(buf, pos)
            frame_end = pos + 7 + size
            if frame_end >= end:  # the frame-end octet is not here yet
                break
            if buf[frame_end] != FRAME_END:
                raise ValueError(f"bad frame end at {pos}: {buf[frame_end]:#x}")
            p = pos + 7
            if kind == 3:  # body: the stamp is in its first frame
                pending = self._pending
                if pending is not None:
                    if size >= STAMP_BYTES:
                        seq, sent_ns = STAMP.unpack_from(buf, p)
                    else:
                        seq, sent_ns = -1, 0
                    deliveries.append((*pending, seq, sent_ns))
                    self._pending = None
                self._body_left -= size
            elif kind == 1:
                class_method = (buf[p] << 24) | (buf[p + 1] << 16) | (buf[p + 2] << 8) | buf[p + 3]
                if class_method == DELIVER:
                    tag_len = buf[p + 4]
                    ctag = bytes(buf[p + 5 : p + 5 + tag_len])
                    dtag, bits = _TAG_AND_BITS.unpack_from(buf, p + 5 + tag_len)
                    self._pending = (channel, ctag, dtag, bool(bits & 1))
                elif class_method in (CONFIRM_ACK, CONFIRM_NACK):
                    dtag, bits = _TAG_AND_BITS.unpack_from(buf, p + 4)
                    self.confirms.append(
                        (channel, dtag, bool(bits & 1), class_method == CONFIRM_NACK)
                    )
                else:
                    self.others.append((channel, class_method, bytes(buf[pos : frame_end + 1])))
            elif kind == 2:  # content header: body size only (no body frame when it is 0)
                self._body_left = _U64.unpack_from(buf, p + 4)[0]
                if self._body_left == 0 and self._pending is not None:
                    deliveries.append((*self._pending, -1, 0))
                    self._pending = None
            # kind 8 (heartbeat) and anything else: skipped
            pos = frame_end + 1
        if pos:
            del buf[:pos]


def decode(whole_frame: bytes) -> Any:
    """A method frame handed back by the parser, decoded by pamqp."""
    return frame.unmarshal(whole_frame)[2]


def method_id(cls: type[Any]) -> int:
    """The parser's class/method int for a pamqp method class (e.g. Queue.DeclareOk)."""
    index: int = cls.index
    return index
