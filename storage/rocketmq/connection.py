"""One TCP connection to a RocketMQ server (name server or broker), many calls in flight.

Requests carry an ``opaque`` number; a reader task hands each response to the call waiting
for that number, so calls from any number of tasks share the connection without a thread
or a lock per call (sends are serialized: a frame is written whole). A broken connection
fails every call in flight with BrokerUnavailable (its outcome unknown) and is opened again
by the next call.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from anyio.abc import SocketStream, TaskGroup

from storage.clients.link import BrokerUnavailable
from storage.rocketmq.remoting import Command, FrameReader, ProtocolError, encode

log = logging.getLogger("mqgw.rocketmq")

CONNECT_TIMEOUT_S = 3.0
READ_CHUNK = 1 << 20


class _Waiter:
    __slots__ = ("done", "response")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.response: Command | None = None


class Connection:
    def __init__(self, address: str, tasks: TaskGroup) -> None:
        self.address = address
        host, _, port = address.rpartition(":")
        self._host, self._port = host, int(port)
        self._tasks = tasks
        self._stream: SocketStream | None = None
        self._opening = anyio.Lock()
        self._sending = anyio.Lock()
        self._waiters: dict[int, _Waiter] = {}
        self._opaque = itertools.count(1)
        self._closed = False

    async def call(self, command: Command, timeout_s: float) -> Command:
        """Send ``command`` and return its response; BrokerUnavailable when the server cannot
        be reached, the connection breaks, or no answer comes within ``timeout_s``."""
        stream = await self._open()
        opaque = command.opaque = next(self._opaque)
        waiter = self._waiters[opaque] = _Waiter()
        try:
            try:
                async with self._sending:
                    await stream.send(encode(command))
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as error:
                self._broken(stream, error)
                raise BrokerUnavailable(f"rocketmq {self.address}: {error!r}") from None
            with anyio.move_on_after(timeout_s):
                await waiter.done.wait()
        finally:
            self._waiters.pop(opaque, None)
        if waiter.response is None:
            if waiter.done.is_set():
                raise BrokerUnavailable(f"rocketmq {self.address}: connection lost")
            raise BrokerUnavailable(f"rocketmq {self.address}: no answer in {timeout_s:.1f} s")
        return waiter.response

    async def _open(self) -> SocketStream:
        if self._closed:
            raise BrokerUnavailable(f"rocketmq {self.address}: client closed")
        if self._stream is not None:
            return self._stream
        async with self._opening:
            if self._stream is None:
                try:
                    with anyio.fail_after(CONNECT_TIMEOUT_S):
                        stream = await anyio.connect_tcp(self._host, self._port)
                except (OSError, TimeoutError) as error:
                    raise BrokerUnavailable(f"rocketmq {self.address}: {error!r}") from None
                self._stream = stream
                self._tasks.start_soon(self._read, stream)
            return self._stream

    async def _read(self, stream: SocketStream) -> None:
        reader = FrameReader()
        try:
            while True:
                data = await stream.receive(READ_CHUNK)
                for command in reader.feed(data):
                    waiter = self._waiters.get(command.opaque)
                    if waiter is not None and command.is_response:
                        waiter.response = command
                        waiter.done.set()
        except (
            OSError,
            anyio.EndOfStream,
            anyio.BrokenResourceError,
            anyio.ClosedResourceError,
            ProtocolError,
        ) as error:
            self._broken(stream, error)

    def _broken(self, stream: SocketStream, error: BaseException) -> None:
        if self._stream is not stream:
            return
        self._stream = None
        if not self._closed:
            log.warning(
                "rocketmq: connection to %s lost (%s)",
                self.address,
                str(error) or type(error).__name__,
            )
        for waiter in self._waiters.values():
            waiter.done.set()  # response None: lost
        self._tasks.start_soon(_close, stream)

    async def aclose(self) -> None:
        self._closed = True
        stream, self._stream = self._stream, None
        if stream is not None:
            for waiter in self._waiters.values():
                waiter.done.set()
            await _close(stream)


async def _close(stream: SocketStream) -> None:
    with anyio.CancelScope(shield=True):
        await stream.aclose()


class Pool:
    """Connections by address, opened on first use (see ``open_pool``)."""

    def __init__(self, tasks: TaskGroup) -> None:
        self._tasks = tasks
        self._by_address: dict[str, Connection] = {}

    def to(self, address: str) -> Connection:
        connection = self._by_address.get(address)
        if connection is None:
            connection = self._by_address[address] = Connection(address, self._tasks)
        return connection

    async def aclose(self) -> None:
        for connection in self._by_address.values():
            await connection.aclose()


@asynccontextmanager
async def open_pool() -> AsyncIterator[Pool]:
    """Connections whose readers run in a task group of their own. What the block raises
    comes out as itself, not inside that group's ExceptionGroup: callers catch
    BrokerUnavailable and the store's errors by type."""
    raised: BaseException | None = None
    async with anyio.create_task_group() as tasks:
        pool = Pool(tasks)
        try:
            yield pool
        except BaseException as error:  # raised again below, as it is
            raised = error
        finally:
            await pool.aclose()
            tasks.cancel_scope.cancel()
    if raised is not None:
        raise raised
