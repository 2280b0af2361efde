"""Broker protocol framing, sans-IO: length-prefixed frames in, frames out.

Frame (little-endian): ``u32 length | u32 request id | u8 op | payload``; ``length`` counts
what follows it (5 + payload). storage/wire/protocol.py gives the ops and payloads meaning;
this module only cuts a byte stream into frames, and offers the few helpers every payload
codec uses.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from storage.errors import StoreError

# A batch holding a message of RabbitMQ's largest size (512 MiB) must fit, with room for the
# small messages read along with it; a bad length must not.
MAX_FRAME_BYTES = 576 << 20
FRAME_LEN = struct.Struct("<I")
FRAME_HEAD = struct.Struct("<IIB")  # length, request id, op
FRAME_HEAD_SIZE = FRAME_HEAD.size  # 9
MIN_LENGTH = FRAME_HEAD_SIZE - FRAME_LEN.size  # request id + op
U8 = struct.Struct("<B")
U16 = struct.Struct("<H")
I64 = struct.Struct("<q")


class ProtocolError(StoreError):
    """Bytes that are not the broker protocol (or a frame over the size limit)."""


class Frame(NamedTuple):
    request_id: int
    op: int
    payload: memoryview  # a slice of immutable bytes


def build_frame(request_id: int, op: int, parts: list[Any]) -> bytes:
    """``parts[0]`` is a placeholder for the head: one join, no copy of the payload."""
    size = sum(map(len, parts)) - len(parts[0])
    parts[0] = FRAME_HEAD.pack(size + MIN_LENGTH, request_id, op)
    return b"".join(parts)


def pack_text(value: str) -> bytes:
    data = value.encode()
    return U16.pack(len(data)) + data


class PayloadReader:
    """A cursor over a payload for the cold paths (the hot loops unpack inline)."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, layout: struct.Struct) -> tuple[Any, ...]:
        values = layout.unpack_from(self.buf, self.pos)
        self.pos += layout.size
        return values

    def text(self) -> str:
        (size,) = self.take(U16)
        end = self.pos + size
        if end > len(self.buf):
            raise ProtocolError("string runs past the end of the frame")
        value = str(self.buf[self.pos : end], "utf-8")
        self.pos = end
        return value

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise ProtocolError(f"payload of {len(self.buf)} bytes, {self.pos} expected")


class FrameDecoder:
    """Bytes in, complete frames out: any split, many frames per read.

    A frame that lies inside one chunk given to ``feed`` is a view of that chunk (no copy);
    one split across chunks is assembled once. A length over ``max_frame_bytes`` raises
    ProtocolError as soon as its 4 bytes arrive, before anything of the frame is buffered.
    """

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._partial = bytearray()  # the start of a frame split across chunks
        self._needed = 0  # what _partial must hold: 4 (the length) or the whole frame

    @property
    def buffered_bytes(self) -> int:
        return len(self._partial)

    def _frame_size(self, length: int) -> int:
        if length < MIN_LENGTH or length > self.max_frame_bytes:
            raise ProtocolError(
                f"frame length {length} outside {MIN_LENGTH}..{self.max_frame_bytes} bytes"
            )
        return FRAME_LEN.size + length

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        # Views must be of immutable bytes: a caller's buffer could be reused under them.
        view = memoryview(data if isinstance(data, bytes) else bytes(data))
        frames: list[Frame] = []
        if self._partial:
            rest = self._complete(view, frames)
            if rest is None:
                return frames
            view = rest
        pos, end = 0, len(view)
        unpack_head = FRAME_HEAD.unpack_from
        while end - pos >= FRAME_HEAD_SIZE:
            length, request_id, op = unpack_head(view, pos)
            stop = pos + self._frame_size(length)
            if stop > end:
                break
            frames.append(Frame(request_id, op, view[pos + FRAME_HEAD_SIZE : stop]))
            pos = stop
        if pos < end:
            rest = view[pos:]
            self._partial += rest
            self._needed = FRAME_LEN.size
            if len(rest) >= FRAME_LEN.size:
                self._needed = self._frame_size(FRAME_LEN.unpack_from(rest)[0])
        return frames

    def _complete(self, view: memoryview, frames: list[Frame]) -> memoryview | None:
        """Top up the split frame from ``view``; the unused rest of ``view``, or None when
        the frame is still incomplete."""
        partial = self._partial
        while True:
            take = self._needed - len(partial)
            partial += view[:take]
            view = view[take:]
            if len(partial) < self._needed:
                return None
            if self._needed == FRAME_LEN.size:  # the length is in: now the whole frame
                self._needed = self._frame_size(FRAME_LEN.unpack_from(partial)[0])
                continue
            whole = bytes(partial)
            partial.clear()
            _, request_id, op = FRAME_HEAD.unpack_from(whole)
            frames.append(Frame(request_id, op, memoryview(whole)[FRAME_HEAD_SIZE:]))
            return view
