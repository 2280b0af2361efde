"""RemoteStore: the StorePort over the broker protocol, to one `mqgw broker`.

One TCP connection, pipelined (storage/clients/link.py: BrokerLink): any number of tasks may
have calls in flight, and an append costs one round trip whether or not it waits for
durability (the broker waits before answering).

The connection is the supervisor task's business, not the callers':
- it connects, says HELLO, and publishes the link; when the link breaks, every call in flight
  fails at once with BrokerUnavailable (its outcome is unknown: an append may have been
  written), and the supervisor reconnects with exponential backoff (jittered, capped).
- a call made while there is no link waits up to ``unavailable_wait_s`` for one, then raises
  BrokerUnavailable; once the broker is back the same RemoteStore serves calls again.
Messages read are memoryview slices of the received frame (no copy per message).
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, cast

import anyio

from storage.clients.link import BrokerLink, BrokerUnavailable, describe_error, enable_keepalive
from storage.errors import StoreClosed, StoreError
from storage.record import Record
from storage.results import (
    QUEUE_GROUP,
    AppendResult,
    DeliveryProgress,
    QueueStats,
    ReadResult,
    RetentionReport,
)
from storage.wire.frames import MAX_FRAME_BYTES, ProtocolError
from storage.wire.replication import Replicate, Replicated
from storage.wire.requests import (
    NO_PROGRESS,
    PROTOCOL_VERSION,
    Append,
    CommitOffsets,
    CommittedOffset,
    CreateQueue,
    DeleteQueue,
    GetQueueStats,
    Hello,
    OffsetCommit,
    OffsetForTime,
    Op,
    Purge,
    Query,
    Read,
    Request,
    Response,
    RestartMarks,
    UncleanMarks,
    WaitDurable,
)

log = logging.getLogger("mqgw.storage.remote")

BACKOFF_FIRST_S = 0.05


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6 address]:port``."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"broker address {address!r} is not HOST:PORT")
    return host.removeprefix("[").removesuffix("]"), int(port)


class RemoteStore:
    """StorePort to one broker; made by ``connect_remote_store`` (or ``RemoteStore.connect``)."""

    def __init__(
        self,
        address: str,
        *,
        name: str = "mqgw",
        unavailable_wait_s: float = 5.0,
        backoff_max_s: float = 1.0,
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        self.address = address
        self.host, self.port = parse_address(address)
        self.name = name  # ours, sent in HELLO for the broker's log lines
        self.unavailable_wait_s = unavailable_wait_s
        self.backoff_max_s = backoff_max_s
        self.max_frame_bytes = max_frame_bytes
        self.broker_name = ""  # from the broker's HELLO
        self.connects = 0
        # Invariant: _connected is set exactly when _link is not None (or when closed).
        self._link: BrokerLink | None = None
        self._connected = anyio.Event()
        self._closed = False
        self._last_error = "not connected yet"
        self._down_since: float | None = None  # when the link went (None: up, or no call yet)
        self.limits: dict[int, int] = {}  # queue id -> max length (reject-publish)
        self.byte_limits: dict[int, int] = {}  # queue id -> max length bytes (reject-publish)

    @classmethod
    def connect(cls, address: str, **options: Any) -> AbstractAsyncContextManager[RemoteStore]:
        return connect_remote_store(address, **options)

    @property
    def connected(self) -> bool:
        return self._link is not None

    # -- connection --------------------------------------------------------------------------

    async def _call(self, request: Request) -> Response:
        link = self._link
        if link is None:
            link = await self._wait_for_link()
        return await link.call(request)

    async def _wait_for_link(self) -> BrokerLink:
        """The link, waited for up to ``unavailable_wait_s`` after it went down (not after
        each call: once the broker has been away that long, calls fail at once, instead of
        every store call of a gateway blocking that long while a broker group is down)."""
        now = anyio.current_time()
        if self._down_since is None:
            self._down_since = now
        with anyio.move_on_after(max(0.0, self._down_since + self.unavailable_wait_s - now)):
            while self._link is None:
                if self._closed:
                    raise StoreClosed("the remote store is closed")
                await self._connected.wait()
            return self._link
        raise BrokerUnavailable(
            f"broker {self.address} unavailable for {self.unavailable_wait_s:g} s "
            f"({self._last_error})"
        )

    def _link_closed(self, link: BrokerLink, reason: str) -> None:
        if self._link is link:
            self._link = None
            self._down_since = anyio.current_time()
            self._connected = anyio.Event()
            self._last_error = reason
            if not self._closed:
                log.warning("lost broker %s at %s: %s", self.broker_name, self.address, reason)

    async def _supervise(self) -> None:
        delay_s = BACKOFF_FIRST_S
        while True:
            try:
                started = anyio.current_time()
                await self._connect_once()
                if anyio.current_time() - started > self.backoff_max_s:
                    delay_s = BACKOFF_FIRST_S  # it was up a while: reconnect at once
                    continue
                # Up and down at once (a broker that accepts, then drops us): back off.
            except (OSError, StoreError, TimeoutError) as error:
                reason = describe_error(error)
                if reason != self._last_error:  # one line per new reason, not per attempt
                    log.warning("broker at %s unreachable: %s; retrying", self.address, reason)
                self._last_error = reason
            await anyio.sleep(delay_s * random.uniform(0.5, 1.0))
            delay_s = min(delay_s * 2, self.backoff_max_s)

    async def _connect_once(self) -> None:
        """Connect, HELLO, publish the link, and return when it breaks."""
        with anyio.fail_after(self.unavailable_wait_s):
            stream = await anyio.connect_tcp(self.host, self.port)
        enable_keepalive(stream)
        link = BrokerLink(stream, self.address, self.max_frame_bytes, self._link_closed)
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(link.run)
            try:
                with anyio.fail_after(self.unavailable_wait_s):
                    hello = cast(Hello, await link.call(Hello(PROTOCOL_VERSION, self.name)))
                if hello.version != PROTOCOL_VERSION:
                    raise ProtocolError(
                        f"broker speaks protocol {hello.version}, we speak {PROTOCOL_VERSION}"
                    )
            except (StoreError, TimeoutError) as error:
                failure = error  # raised outside the group, unwrapped, for _supervise
                tg.cancel_scope.cancel()
            else:
                self.broker_name = hello.name
                self.connects += 1
                self._link = link
                self._down_since = None
                self._connected.set()
                log.info("connected to broker %s at %s", hello.name, self.address)
        if failure is not None:
            raise failure
        # link.run returned: the connection broke and _link_closed has run.

    def _shut(self) -> None:
        self._closed = True
        if self._link is not None:
            self._link.fail_with = StoreClosed("the remote store is closed")
        self._connected.set()  # wakes callers waiting for a link: they see _closed

    # -- StorePort -----------------------------------------------------------------------------

    async def append(self, records: Sequence[Record], wait_durable: bool = True) -> AppendResult:
        limits = limits_for(self.limits, records) if self.limits else ()
        byte_limits = limits_for(self.byte_limits, records) if self.byte_limits else ()
        request = Append(records, wait_durable, 0, limits, byte_limits)
        return cast(AppendResult, await self._call(request))

    async def append_batch(
        self,
        records: Sequence[Record],
        batch_id: int,
        wait_durable: bool = True,
        limits: Sequence[tuple[int, int]] = (),
        byte_limits: Sequence[tuple[int, int]] = (),
    ) -> AppendResult:
        """An append a replicated broker stores once however often it is sent (``batch_id``)."""
        request = Append(records, wait_durable, batch_id, limits, byte_limits)
        return cast(AppendResult, await self._call(request))

    def set_append_limit(
        self, queue_id: int, max_length: int | None, max_length_bytes: int | None = None
    ) -> None:
        set_limit(self.limits, queue_id, max_length)
        set_limit(self.byte_limits, queue_id, max_length_bytes)

    async def replicate(self, request: Replicate) -> Replicated:
        """A slave's call to its master (storage/replication/member.py)."""
        return cast(Replicated, await self._call(request))

    async def wait_durable(self, end_offset: int) -> None:
        await self._call(WaitDurable(end_offset))

    async def backlog_bytes(self) -> int:
        return cast(int, await self._call(Query(Op.BACKLOG_BYTES)))

    async def read(
        self,
        queue_id: int,
        partition: int,
        offset: int,
        max_count: int = 256,
        max_bytes: int = 4 << 20,
        wait_ms: int = 0,
        fence: int = 0,
    ) -> ReadResult:
        # The answer must fit in a frame: fewer messages per read is still a correct answer
        # (next_offset says where to go on); one record is always sent whatever its size.
        max_bytes = min(max_bytes, self.max_frame_bytes // 2)
        request = Read(queue_id, partition, offset, max_count, max_bytes, wait_ms, fence)
        return cast(ReadResult, await self._call(request))

    async def create_queue(self, queue_id: int, partitions: int) -> None:
        await self._call(CreateQueue(queue_id, partitions))

    async def queues(self) -> dict[int, int]:
        return cast(dict[int, int], await self._call(Query(Op.QUEUES)))

    async def delete_queue(self, queue_id: int) -> None:
        await self._call(DeleteQueue(queue_id))

    async def purge(self, queue_id: int, group: str = QUEUE_GROUP) -> int:
        return cast(int, await self._call(Purge(queue_id, group)))

    async def queue_stats(self, queue_id: int, group: str = QUEUE_GROUP) -> QueueStats:
        return cast(QueueStats, await self._call(GetQueueStats(queue_id, group)))

    async def commit_offset(
        self,
        group: str,
        queue_id: int,
        partition: int,
        offset: int,
        fence: int = 0,
        progress: DeliveryProgress | None = None,
    ) -> None:
        report = progress or NO_PROGRESS
        commit = OffsetCommit(group, queue_id, partition, offset, fence, *report)
        await self._call(CommitOffsets([commit]))

    async def commit_offsets(self, commits: Sequence[OffsetCommit]) -> None:
        """Several commits in one round trip (applied in order; see wire.CommitOffsets)."""
        await self._call(CommitOffsets(commits))

    async def committed_offset(
        self, group: str, queue_id: int, partition: int, fence: int = 0
    ) -> int:
        request = CommittedOffset(group, queue_id, partition, fence)
        return cast(int, await self._call(request))

    async def offset_for_time(self, queue_id: int, partition: int, ts_ms: int) -> int:
        return cast(int, await self._call(OffsetForTime(queue_id, partition, ts_ms)))

    async def apply_retention(self) -> RetentionReport:
        return cast(RetentionReport, await self._call(Query(Op.APPLY_RETENTION)))

    async def disk_bytes(self) -> int:
        return cast(int, await self._call(Query(Op.DISK_BYTES)))

    async def held_back_bytes(self) -> dict[int, int]:
        return cast(dict[int, int], await self._call(Query(Op.HELD_BACK_BYTES)))

    async def oldest_segment_ts(self) -> int | None:
        return cast(int | None, await self._call(Query(Op.OLDEST_SEGMENT_TS)))

    async def unclean_marks(self, queue_id: int) -> dict[int, int]:
        return cast(dict[int, int], await self._call(UncleanMarks(queue_id)))

    async def restart_marks(self, queue_id: int) -> dict[int, int]:
        return cast(dict[int, int], await self._call(RestartMarks(queue_id)))


def set_limit(limits: dict[int, int], queue_id: int, limit: int | None) -> None:
    """Note a queue's limit, or forget it (None)."""
    if limit is None:
        limits.pop(queue_id, None)
    else:
        limits[queue_id] = limit


def limits_for(limits: dict[int, int], records: Sequence[Record]) -> list[tuple[int, int]]:
    """The (queue id, limit) of the limited queues ``records`` reach."""
    found: dict[int, int] = {}
    last: object = None
    for record in records:
        destinations = record.destinations
        if destinations is last:  # batches usually repeat one destination tuple
            continue
        last = destinations
        for queue_id, _ in destinations:
            limit = limits.get(queue_id)
            if limit is not None:
                found[queue_id] = limit
    return list(found.items())


@asynccontextmanager
async def connect_remote_store(address: str, **options: Any) -> AsyncIterator[RemoteStore]:
    """A RemoteStore connected to the broker at ``address`` (``host:port``), reconnecting by
    itself until the block ends. BrokerUnavailable if the first connection does not come up
    within ``unavailable_wait_s``. ``options``: RemoteStore's keyword arguments."""
    store = RemoteStore(address, **options)
    failure: BrokerUnavailable | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(store._supervise)
        try:
            await store._wait_for_link()
        except BrokerUnavailable as error:
            failure = error
        else:
            try:
                yield store
            finally:
                store._shut()
        tg.cancel_scope.cancel()
    if failure is not None:
        raise failure
