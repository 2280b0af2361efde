"""One pipelined connection to a broker: request ids, calls in flight, reader and writer.

A call encodes its request, files a waiter under a fresh request id, and sleeps; the writer
sends whatever requests are ready as one buffer, the reader hands each answer to the waiter
of its id (answers come in any order). When the connection breaks every call in flight fails
at once with ``BrokerUnavailable`` and the owner (storage/clients/remote.py's RemoteStore,
which reconnects) is told. Also the TCP keepalive settings both ends of the protocol use.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import anyio
from anyio.abc import SocketAttribute, SocketStream

from storage.errors import StoreError
from storage.wire.frames import FRAME_LEN, Frame, FrameDecoder, ProtocolError
from storage.wire.protocol import decode_response, encode_request, request_op
from storage.wire.requests import Op, Request, Response

READ_SIZE = 256 << 10
# A peer that vanished without a FIN or RST (host down, partition) is found by TCP keepalive:
# idle 5 s, then 3 probes 2 s apart. Otherwise calls in flight would wait forever.
KEEPALIVE = (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 3))
# Keepalive only probes an idle connection. One with a request unanswered behind a partition
# keeps retransmitting with a doubling delay, so after the heal it could wait 10 s or more for
# the next try (the nemesis run saw a slave rejoin 12 s late). Data unacknowledged this long
# (the peer's kernel acknowledges even when its process is paused) closes it: reconnect.
USER_TIMEOUT_MS = 6000


class BrokerUnavailable(StoreError):
    """The broker cannot be reached. For a call that was in flight when the connection broke
    the outcome is unknown: an append may or may not have been written."""


def enable_keepalive(stream: SocketStream) -> None:
    """Turn on TCP keepalive with short timers (both ends of the broker protocol use it)."""
    sock = stream.extra(SocketAttribute.raw_socket)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (*KEEPALIVE, ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS)):
        if hasattr(socket, name):  # Linux names; elsewhere the system's defaults apply
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class _Waiter:
    __slots__ = ("done", "error", "frame")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.frame: Frame | None = None
        self.error: Exception | None = None


class BrokerLink:
    """One connection to the broker: request ids, calls in flight, reader and writer."""

    def __init__(
        self,
        stream: SocketStream,
        address: str,
        max_frame_bytes: int,
        on_closed: Callable[[BrokerLink, str], None],
    ) -> None:
        self.stream = stream
        self.address = address
        self.max_frame_bytes = max_frame_bytes
        self.closed = False
        self.fail_with: StoreError | None = None  # what calls in flight get (default: unavailable)
        self._on_closed = on_closed
        self._decoder = FrameDecoder(max_frame_bytes)
        self._pending: dict[int, _Waiter] = {}
        self._outbox: list[bytes] = []
        self._wake = anyio.Event()
        self._last_id = 0

    async def call(self, request: Request) -> Response:
        if self.closed:
            raise BrokerUnavailable(f"connection to broker {self.address} closed")
        pending = self._pending
        request_id = self._last_id = (self._last_id + 1) & 0xFFFFFFFF
        while request_id in pending:  # after wrapping around: skip ids still in flight
            request_id = self._last_id = (request_id + 1) & 0xFFFFFFFF
        data = encode_request(request_id, request)
        if len(data) - FRAME_LEN.size > self.max_frame_bytes:
            raise ProtocolError(
                f"request of {len(data)} bytes exceeds the frame limit of "
                f"{self.max_frame_bytes} bytes: send smaller batches"
            )
        waiter = pending[request_id] = _Waiter()
        self._outbox.append(data)
        self._wake.set()
        try:
            await waiter.done.wait()
        finally:
            pending.pop(request_id, None)  # cancelled: its answer, if any, is dropped
        if waiter.error is not None:
            raise waiter.error
        frame = waiter.frame
        assert frame is not None
        if frame.op != request_op(request) and frame.op != Op.ERROR:
            raise ProtocolError(f"answer with op {frame.op} to a {request_op(request).name}")
        return decode_response(frame)  # raises the broker's typed error for ERROR

    async def run(self) -> None:
        """Read answers and send requests until the connection breaks; then fail every call
        in flight and tell the owner."""
        reason = "closed"
        try:
            async with self.stream, anyio.create_task_group() as tg:
                tg.start_soon(self._write_loop)
                reason = await self._read_loop()
                tg.cancel_scope.cancel()
        except Exception as error:
            reason = describe_error(error)
        finally:
            self.closed = True
            message = f"connection to broker {self.address} lost: {reason}"
            kind: type[StoreError] = BrokerUnavailable
            if self.fail_with is not None:
                kind, message = type(self.fail_with), str(self.fail_with)
            for waiter in self._pending.values():
                waiter.error = kind(message)  # one each: a raised exception collects its trace
                waiter.done.set()
            self._pending.clear()
            self._on_closed(self, reason)

    async def _read_loop(self) -> str:
        pending = self._pending
        while True:
            try:
                data = await self.stream.receive(READ_SIZE)
            except anyio.EndOfStream:
                return "the broker closed the connection"
            for frame in self._decoder.feed(data):  # ProtocolError: the link breaks
                waiter = pending.pop(frame.request_id, None)
                if waiter is not None:  # None: its caller was cancelled
                    waiter.frame = frame
                    waiter.done.set()

    async def _write_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            while self._outbox:
                outbox, self._outbox = self._outbox, []
                await self.stream.send(outbox[0] if len(outbox) == 1 else b"".join(outbox))


def describe_error(error: BaseException) -> str:
    """One line for a log or an error message: a group of one error reads as that error."""
    if isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        return describe_error(error.exceptions[0])
    return str(error) or repr(error)
