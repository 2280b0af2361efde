"""One client connection of `mqgw broker`: the store API over the broker protocol.

Per connection three tasks, whatever the number of requests in flight:
- the reader decodes each frame and makes its store call at once, in arrival order. Store
  calls do not wait (the store serves reads from the page cache and appends into it), so
  arrival order is the order the store sees: a client's appends keep their order, and a
  commit followed by a read sees the commit. Nothing here spawns a task per request.
- waiting for durability is the one thing that takes time: an append that asks for it (and a
  WAIT_DURABLE) joins the connection's durability queue, and the durability task answers the
  queue in rounds, one ``wait_durable`` per round. Meanwhile the reader goes on, so a read
  behind a durable append is answered first: answers go out as they complete, tagged with
  their request id. Appends from every connection share the store's group commit.
- the writer sends every answer ready since it last woke as one buffer (coalesced per loop
  turn). Answers waiting to be sent above OUTBOX_LIMIT_BYTES stop the reader: a client that
  does not read its answers is back-pressured, not buffered without bound.
A READ with ``wait_ms`` that finds nothing new is held in a task of its own (many per
connection are fine, none holds the reader) until an append reaches its partition, its queue
is deleted or purged, the wait runs out, or the connection goes (storage/broker/limits.py:
ReadWaits). An APPEND has its destinations in closed partitions refused first
(storage/log/closed_partitions.py), then, when it carries length limits, those that would pass
one (byte limits counted from running sums of body sizes: broker_limits.ReadyBytes).
A protocol error closes that connection only (logged with the peer's address); on a broker
stop it reads no more and answers what is in flight (bounded) before it closes.
"""

from __future__ import annotations

import logging

import anyio
from anyio.abc import SocketAttribute, SocketStream

from storage.broker.limits import ReadWaits, ReadyBytes, refuse_over_limits
from storage.broker.store_calls import QUERY_CALLS, STORE_CALLS, closed_of, ready_bytes_of
from storage.errors import StoreError
from storage.log.closed_partitions import merge_refusals, refuse_closed
from storage.port import StorePort
from storage.replication.replicated_store import ReplicatedStore
from storage.results import AppendResult, ReadStatus
from storage.wire.errors import encode_error
from storage.wire.frames import Frame, FrameDecoder, ProtocolError
from storage.wire.protocol import decode_request, encode_response
from storage.wire.replication import Replicate, Replicated
from storage.wire.requests import (
    PROTOCOL_VERSION,
    Append,
    DeleteQueue,
    Hello,
    Op,
    Purge,
    Query,
    Read,
    WaitDurable,
)

log = logging.getLogger("mqgw.storage.broker")

READ_SIZE = 256 << 10
OUTBOX_LIMIT_BYTES = 64 << 20
DRAIN_TIMEOUT_S = 5.0


def _peer(stream: SocketStream) -> str:
    address = stream.extra(SocketAttribute.remote_address, None)
    if isinstance(address, tuple):
        return f"{address[0]}:{address[1]}"
    return str(address)


class BrokerConnection:
    """One client connection: reader, durability task and writer (see the module doc)."""

    def __init__(
        self,
        store: StorePort,
        stream: SocketStream,
        broker_name: str,
        max_frame_bytes: int,
        replicated: ReplicatedStore | None = None,
        waits: ReadWaits | None = None,
        ready_bytes: ReadyBytes | None = None,
    ) -> None:
        self.store = store
        self.replicated = replicated  # the same store, when the broker is in a replicated group
        self.waits = ReadWaits() if waits is None else waits  # the broker's, shared
        # The broker's, shared: body bytes of byte-limited queues, kept across appends.
        self.ready_bytes = ready_bytes_of(store, replicated) if ready_bytes is None else ready_bytes
        self.closed = closed_of(store, replicated)
        self._tasks: anyio.abc.TaskGroup | None = None
        self.stream = stream
        self.broker_name = broker_name
        self.peer = _peer(stream)
        self.client = "?"  # the name its HELLO gave
        self.requests = 0
        self._decoder = FrameDecoder(max_frame_bytes)
        self._outbox: list[bytes] = []
        self._outbox_bytes = 0
        self._sending = False
        self._unanswered = 0
        # Waiting for durability: (end offset, request id, the answer to send once durable).
        self._durable: list[tuple[int, int, bytes]] = []
        self._writer_wake = anyio.Event()
        self._durable_wake = anyio.Event()
        self._progress = anyio.Event()  # set whenever the writer has sent something
        self._reading = anyio.CancelScope()
        self._stopping = False
        self._lost: str | None = None  # why writing failed

    def stop(self) -> None:
        """The broker is stopping: read no more, answer what is in flight, close."""
        self._stopping = True
        self._reading.cancel()
        self.waits.wake_all()  # held reads answer now (nothing new)

    async def run(self) -> str:
        """Serve until the client goes, breaks the protocol, or the broker stops; the reason."""
        async with anyio.create_task_group() as tg:
            self._tasks = tg
            tg.start_soon(self._write_loop)
            tg.start_soon(self._durable_loop)
            reason = "broker stopping"
            with self._reading:
                reason = await self._read_loop()
            if self._stopping:
                with anyio.move_on_after(DRAIN_TIMEOUT_S):
                    while self._lost is None and (
                        self._unanswered or self._outbox or self._sending
                    ):
                        await self._wait_progress()
            tg.cancel_scope.cancel()
        return self._lost or reason

    async def _read_loop(self) -> str:
        while True:
            try:
                data = await self.stream.receive(READ_SIZE)
            except anyio.EndOfStream:
                return "client closed the connection"
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as error:
                return f"connection lost ({error!r})"
            try:
                for frame in self._decoder.feed(data):
                    await self._handle(frame)
            except ProtocolError as error:
                log.warning(
                    "broker connection from %s (%s): protocol error, closing it: %s",
                    self.peer,
                    self.client,
                    error,
                )
                return f"protocol error: {error}"
            while self._outbox_bytes > OUTBOX_LIMIT_BYTES and self._lost is None:
                await self._wait_progress()

    async def _handle(self, frame: Frame) -> None:
        request = decode_request(frame)  # ProtocolError: the caller closes the connection
        request_id = frame.request_id
        self.requests += 1
        self._unanswered += 1
        store = self.store
        try:
            if isinstance(request, Append):
                # Written now, in arrival order; durability is waited for off the reader.
                result = await self._append(request)
                answer = encode_response(request_id, Op.APPEND, result)
                if request.wait_durable:
                    self._after_durable(result.end_offset, request_id, answer)
                else:
                    self._answer(answer)
            elif isinstance(request, WaitDurable):
                answer = encode_response(request_id, Op.WAIT_DURABLE, None)
                self._after_durable(request.end_offset, request_id, answer)
            elif isinstance(request, Hello):
                self.client = request.name
                log.debug("broker connection from %s is %s", self.peer, request.name)
                hello = Hello(PROTOCOL_VERSION, self.broker_name)
                self._answer(encode_response(request_id, Op.HELLO, hello))
            elif isinstance(request, Replicate):
                try:
                    replicated = await self._replicate(request)
                except anyio.get_cancelled_exc_class():
                    self._unanswered -= 1  # stopping: a held fetch goes unanswered
                    raise
                self._answer(encode_response(request_id, Op.REPLICATE, replicated))
            elif isinstance(request, Read) and request.wait_ms > 0:
                found = await store.read(*request[:5], fence=request.fence)
                if found.messages or found.status is not ReadStatus.NO_NEW_MESSAGE:
                    self._answer(encode_response(request_id, Op.READ, found))
                else:
                    assert self._tasks is not None
                    self._tasks.start_soon(self._held_read, request_id, request)
            elif isinstance(request, Query):
                value = await QUERY_CALLS[request.op](store)
                self._answer(encode_response(request_id, request.op, value))
            else:
                value = await STORE_CALLS[type(request)](store, request)
                self._answer(encode_response(request_id, Op(frame.op), value))
                if isinstance(request, DeleteQueue | Purge):
                    self.waits.wake_queue(request.queue_id)
                if isinstance(request, DeleteQueue):
                    self.ready_bytes.forget(request.queue_id)
        except Exception as error:
            if not isinstance(error, StoreError | ValueError):
                log.exception("broker: %s from %s failed", Op(frame.op).name, self.peer)
            self._answer(encode_error(request_id, error))

    async def _append(self, request: Append) -> AppendResult:
        known = self.replicated.known_batch(request.batch_id) if self.replicated else None
        if known is not None:
            # A re-send of a stored batch: answered as the first time. Counting the limits
            # again would count the batch against itself and could nack what was stored.
            return known
        # Closed partitions first, so that what they refuse takes no room under a limit. No
        # closure can land before the append: the limits' awaits do not yield (their doc).
        records, refused = refuse_closed(request.records, self.closed)
        if request.limits or request.byte_limits:
            kept, over = await refuse_over_limits(
                self.store, records, request.limits, request.byte_limits, self.ready_bytes
            )
            if over:
                refused = merge_refusals(request.records, refused, over)
                records = kept
        if self.replicated is not None:
            result = await self.replicated.append(
                records, wait_durable=False, batch_id=request.batch_id, refused=refused
            )
        else:
            result = await self.store.append(records, wait_durable=False)
        if len(self.waits) and result.queue_starts:
            self.waits.wake(result.queue_starts)
        if len(self.ready_bytes):
            self.ready_bytes.appended(records, result.queue_starts)
        if refused:  # indexes moved: the gateway reads the kept ones back
            result = result._replace(record_offsets=(), queue_starts=None, refused=tuple(refused))
        return result

    async def _held_read(self, request_id: int, request: Read) -> None:
        """A READ with nothing new: answered when its partition has records, its queue is
        deleted or purged, its wait runs out or the broker stops; cancelled with the
        connection (its answer would have nowhere to go)."""
        key = (request.queue_id, request.partition)
        deadline = anyio.current_time() + request.wait_ms / 1000
        appended = False  # an append reached the partition while this read waited
        resets = self.waits.resets.get(key[0], 0)
        try:
            while True:
                event = self.waits.event(key)
                result = await self.store.read(*request[:5], fence=request.fence)
                left = deadline - anyio.current_time()
                if result.messages or result.status is not ReadStatus.NO_NEW_MESSAGE:
                    break
                if left <= 0 or self._stopping or self.waits.resets.get(key[0], 0) != resets:
                    break
                waited = event
                if appended and self.replicated is not None:
                    # Appended but not yet confirmed (a replicated master's reads stop at its
                    # confirm offset): the next confirm may make it readable.
                    waited = self.replicated.changed_event()
                with anyio.move_on_after(left):
                    await waited.wait()
                appended = appended or event.is_set()
        except anyio.get_cancelled_exc_class():
            self._unanswered -= 1
            raise
        except Exception as error:
            self._answer(encode_error(request_id, error))
            return
        self._answer(encode_response(request_id, Op.READ, result))

    async def _replicate(self, request: Replicate) -> Replicated:
        """A slave's call; a fetch may be held (up to its wait) while nothing is new: one
        fetch is in flight per slave connection, so holding its reader costs nothing."""
        if self.replicated is None:
            raise StoreError(f"broker {self.broker_name} is not in a replicated group")
        if request.kind == "epochs":
            return self.replicated.serve_epochs(request.head)
        if request.kind == "fetch":
            return await self.replicated.serve_fetch(request.head)
        raise StoreError(f"unknown replication call {request.kind!r}")

    def _after_durable(self, end_offset: int, request_id: int, answer: bytes) -> None:
        self._durable.append((end_offset, request_id, answer))
        self._durable_wake.set()

    async def _durable_loop(self) -> None:
        while True:
            await self._durable_wake.wait()
            self._durable_wake = anyio.Event()
            while self._durable:
                batch, self._durable = self._durable, []
                try:
                    await self.store.wait_durable(max(end for end, _, _ in batch))
                except Exception as error:  # a failed fsync fails every append waiting on it
                    for _, request_id, _ in batch:
                        self._answer(encode_error(request_id, error))
                else:
                    for _, _, answer in batch:
                        self._answer(answer)

    def _answer(self, frame: bytes) -> None:
        self._unanswered -= 1
        self._outbox.append(frame)
        self._outbox_bytes += len(frame)
        self._writer_wake.set()

    async def _wait_progress(self) -> None:
        self._progress = anyio.Event()
        await self._progress.wait()

    async def _write_loop(self) -> None:
        while True:
            await self._writer_wake.wait()
            self._writer_wake = anyio.Event()
            while self._outbox:
                outbox = self._outbox
                data = outbox[0] if len(outbox) == 1 else b"".join(outbox)
                self._outbox, self._outbox_bytes = [], 0
                self._sending = True
                try:
                    await self.stream.send(data)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as error:
                    self._lost = f"connection lost while sending ({error!r})"
                    self._reading.cancel()
                    return
                finally:
                    self._sending = False
                    self._progress.set()
