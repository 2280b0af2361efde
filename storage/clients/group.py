"""StorePort over a replicated broker group: the gateway's side of failover (docs/controller.md,
rule 13).

The group's master is the one the controller's record names; this store follows that record
(every ``POLL_S``) and keeps one ``RemoteStore`` to the master's address. When the master
changes, calls go to the new one, and appends not yet confirmed are **sent again**, in their
order, with the batch id they were first sent with: a broker that already holds a batch (it
reached the old master and was replicated) stores it once.

Offsets in the ``AppendResult``s it returns are its own: ``end_offset`` is a sequence number of
the batch, which ``wait_durable`` understands; the brokers' commitlog offsets change meaning
with the master. Messages are not handed to consumers from the batch in hand
(``queue_starts`` is None): a consumer reads them back once the group confirmed them.

Calls wait up to ``failover_wait_s`` for a master; ``NotMaster`` and lost connections are
retried inside that bound, so a failover costs a publisher a pause, not an error.
"""

from __future__ import annotations

import logging
import random
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import anyio
from anyio.abc import TaskGroup
from redis.asyncio import Redis

from meta.groups.link import GroupLink
from meta.redis_url import async_client
from storage.clients.link import BrokerUnavailable
from storage.clients.remote import RemoteStore, connect_remote_store, limits_for, set_limit
from storage.errors import NotMaster, StoreClosed, StoreError
from storage.record import Record
from storage.repeated_failure import RepeatedFailure
from storage.results import (
    QUEUE_GROUP,
    AppendResult,
    DeliveryProgress,
    QueueStats,
    ReadResult,
    RetentionReport,
)

log = logging.getLogger("mqgw.storage.group")

POLL_S = 0.1
RETRY_S = 0.05
T = TypeVar("T")
# Worth retrying on another master (or the same one once it knows it is master).
RETRIABLE = (NotMaster, BrokerUnavailable, StoreClosed)


@dataclass
class _Batch:
    records: Sequence[Record]
    batch_id: int
    generation: int  # the master connection it was sent on
    end: int  # its end offset in that master's log


class GroupStore:
    def __init__(self, link: GroupLink, group: str, *, name: str = "mqgw",
                 failover_wait_s: float = 15.0) -> None:  # fmt: skip
        self.link = link
        self.group = group
        self.name = name
        self.failover_wait_s = failover_wait_s
        self.master = ("", 0)  # (broker id, epoch) of the connection in use
        self.generation = 0
        self.failovers = 0
        self._store: RemoteStore | None = None
        self._changed = anyio.Event()
        self._close_current: Callable[[], None] = lambda: None
        self._seq = 0
        self.limits: dict[int, int] = {}  # queue id -> max length (reject-publish)
        self.byte_limits: dict[int, int] = {}  # queue id -> max length bytes (reject-publish)
        self._id_base = random.getrandbits(40) << 24  # batch ids unique across gateways
        self._pending: OrderedDict[int, _Batch] = OrderedDict()
        self._resending = anyio.Lock()

    # -- following the master ------------------------------------------------------------------

    async def follow(self) -> None:
        """Run for the store's life: connect to each new master the record names."""
        failures = RepeatedFailure()  # ten rounds a second: one line per reason
        async with anyio.create_task_group() as tg:
            while True:
                try:
                    record = await self.link.record(self.group)
                    if record.master and (record.master, record.epoch) != self.master:
                        await self._connect(tg, record.master, record.epoch)
                except Exception as error:  # Redis or the broker away: keep following
                    if (reason := failures.failed(error)) is not None:
                        log.warning("group %s: cannot follow the master yet: %s (logged again "
                                    "when the reason changes)", self.group, reason)  # fmt: skip
                else:
                    if failures.recovered():
                        log.info("group %s: following the master's record again", self.group)
                await anyio.sleep(POLL_S)

    async def _connect(self, tg: TaskGroup, master: str, epoch: int) -> None:
        key = self.link.keys.replica(self.group, master)
        address = await self.link.client.hget(key, "address")
        if not address:
            raise StoreError(f"master {master} has no address in Redis yet")
        # Each connection lives in its own task, so that closing the old one after the new
        # one is up does not unwind scopes out of order.
        opened: list[RemoteStore] = []
        up, done = anyio.Event(), anyio.Event()

        async def hold() -> None:
            async with connect_remote_store(
                str(address), name=self.name, unavailable_wait_s=2.0
            ) as store:
                opened.append(store)
                up.set()
                await done.wait()

        failed: list[BaseException] = []

        async def guarded() -> None:
            try:
                await hold()
            except Exception as error:
                failed.append(error)
                up.set()

        tg.start_soon(guarded)
        await up.wait()
        if failed:
            raise failed[0]
        previous, close_old = self.master[0], self._close_current
        self._store, self.master, self._close_current = opened[0], (master, epoch), done.set
        self.generation += 1
        if previous:
            self.failovers += 1
            log.warning("group %s: master is now %s at epoch %d (was %s)",
                        self.group, master, epoch, previous)  # fmt: skip
        else:
            log.info("group %s: master %s at epoch %d (%s)", self.group, master, epoch, address)
        self._changed.set()
        self._changed = anyio.Event()
        close_old()

    @property
    def connected(self) -> bool:
        """Connected to a master now."""
        return self._store is not None and self._store.connected

    async def wait_ready(self, timeout_s: float) -> None:
        with anyio.fail_after(timeout_s):
            while self._store is None:
                await self._changed.wait()

    async def _on_master(self, call: Callable[[RemoteStore], Awaitable[T]]) -> T:
        """``call`` on the master, retried across a failover for up to ``failover_wait_s``."""
        last: Exception | None = None
        with anyio.move_on_after(self.failover_wait_s):
            while True:
                store = self._store
                if store is None:
                    await self._changed.wait()
                    continue
                try:
                    return await call(store)
                except RETRIABLE as error:
                    last = error
                    with anyio.move_on_after(RETRY_S):
                        await self._changed.wait()
        raise BrokerUnavailable(f"group {self.group}: no master for {self.failover_wait_s:g} s "
                                f"({last})")  # fmt: skip

    # -- appends and confirms -----------------------------------------------------------------

    async def append(self, records: Sequence[Record], wait_durable: bool = True) -> AppendResult:
        if self._resending.locked():  # keep order: what is re-sent goes first
            async with self._resending:
                pass
        self._seq += 1
        seq = self._seq
        batch = _Batch(records, self._id_base + seq, 0, 0)
        self._pending[seq] = batch

        try:
            result = await self._on_master(lambda store: self._send(store, batch))
        except BaseException:
            self._pending.pop(seq, None)
            raise
        answer = AppendResult(
            seq - 1, seq, len(records), (), None, result.store_ts_ms, result.refused
        )
        if wait_durable:
            await self.wait_durable(seq)
        return answer

    async def wait_durable(self, end_offset: int) -> None:
        """Every batch up to sequence ``end_offset`` is confirmed by the group."""
        with anyio.move_on_after(self.failover_wait_s):
            await self._confirmed(end_offset)
            return
        raise BrokerUnavailable(
            f"group {self.group}: appends not confirmed within {self.failover_wait_s:g} s"
        )

    async def _confirmed(self, end_offset: int) -> None:
        while True:
            waiting = [b for seq, b in self._pending.items() if seq <= end_offset]
            if not waiting:
                return
            last = waiting[-1]
            store = self._store
            if store is not None and all(b.generation == self.generation for b in waiting):
                try:
                    await store.wait_durable(last.end)
                except RETRIABLE:
                    await self._await_change()
                    continue
                for seq in [s for s in self._pending if s <= end_offset]:
                    if self._pending[seq].generation == self.generation:
                        del self._pending[seq]
                continue
            await self._resend()

    async def _await_change(self) -> None:
        with anyio.move_on_after(RETRY_S * 4):
            await self._changed.wait()

    async def _send(self, store: RemoteStore, batch: _Batch) -> AppendResult:
        """Send ``batch`` on the current master's connection and note where it landed."""
        generation = self.generation
        records = batch.records
        limits = limits_for(self.limits, records) if self.limits else ()
        byte_limits = limits_for(self.byte_limits, records) if self.byte_limits else ()
        result = await store.append_batch(
            records, batch.batch_id, wait_durable=False, limits=limits, byte_limits=byte_limits
        )
        batch.generation, batch.end = generation, result.end_offset
        return result

    async def _resend(self) -> None:
        """Send every unconfirmed batch from an older connection again, in order."""
        async with self._resending:
            for batch in list(self._pending.values()):
                if batch.generation == self.generation:
                    continue
                await self._on_master(partial(self._send, batch=batch))

    async def sweep(self) -> None:
        """Confirms nobody waits for (publishers without confirms) still end: forget their
        batches once the group has them, so the pending list stays short."""
        while True:
            await anyio.sleep(POLL_S)
            if self._pending:
                with anyio.move_on_after(1.0):
                    try:
                        await self._confirmed(next(reversed(self._pending)))
                    except StoreError as error:
                        log.debug("group %s: sweep: %s", self.group, error)

    async def backlog_bytes(self) -> int:
        return await self._on_master(lambda s: s.backlog_bytes())

    # -- everything else goes to the master as it is -------------------------------------------

    async def read(
        self, queue_id: int, partition: int, offset: int, max_count: int = 256,
        max_bytes: int = 4 << 20, wait_ms: int = 0, fence: int = 0,
    ) -> ReadResult:  # fmt: skip
        return await self._on_master(
            lambda s: s.read(queue_id, partition, offset, max_count, max_bytes, wait_ms, fence)
        )

    def set_append_limit(
        self, queue_id: int, max_length: int | None, max_length_bytes: int | None = None
    ) -> None:
        set_limit(self.limits, queue_id, max_length)
        set_limit(self.byte_limits, queue_id, max_length_bytes)

    async def create_queue(self, queue_id: int, partitions: int) -> None:
        await self._on_master(lambda s: s.create_queue(queue_id, partitions))

    async def queues(self) -> dict[int, int]:
        return await self._on_master(lambda s: s.queues())

    async def delete_queue(self, queue_id: int) -> None:
        await self._on_master(lambda s: s.delete_queue(queue_id))

    async def purge(self, queue_id: int, group: str = QUEUE_GROUP) -> int:
        return await self._on_master(lambda s: s.purge(queue_id, group))

    async def queue_stats(self, queue_id: int, group: str = QUEUE_GROUP) -> QueueStats:
        return await self._on_master(lambda s: s.queue_stats(queue_id, group))

    async def commit_offset(
        self,
        group: str,
        queue_id: int,
        partition: int,
        offset: int,
        fence: int = 0,
        progress: DeliveryProgress | None = None,
    ) -> None:
        await self._on_master(
            lambda s: s.commit_offset(group, queue_id, partition, offset, fence, progress)
        )

    async def committed_offset(
        self, group: str, queue_id: int, partition: int, fence: int = 0
    ) -> int:
        return await self._on_master(
            lambda s: s.committed_offset(group, queue_id, partition, fence)
        )

    async def offset_for_time(self, queue_id: int, partition: int, ts_ms: int) -> int:
        return await self._on_master(lambda s: s.offset_for_time(queue_id, partition, ts_ms))

    async def apply_retention(self) -> RetentionReport:
        return await self._on_master(lambda s: s.apply_retention())

    async def disk_bytes(self) -> int:
        return await self._on_master(lambda s: s.disk_bytes())

    async def held_back_bytes(self) -> dict[int, int]:
        return await self._on_master(lambda s: s.held_back_bytes())

    async def oldest_segment_ts(self) -> int | None:
        return await self._on_master(lambda s: s.oldest_segment_ts())

    async def restart_marks(self, queue_id: int) -> dict[int, int]:
        return await self._on_master(lambda s: s.restart_marks(queue_id))

    async def unclean_marks(self, queue_id: int) -> dict[int, int]:
        return await self._on_master(lambda s: s.unclean_marks(queue_id))


@asynccontextmanager
async def open_group_store(
    link: GroupLink, group: str, *, name: str = "mqgw", ready_wait_s: float = 30.0
) -> AsyncIterator[GroupStore]:
    """A GroupStore following ``group``'s master until the block ends; waits for a master."""
    store = GroupStore(link, group, name=name)
    async with anyio.create_task_group() as tg:
        tg.start_soon(store.follow)
        tg.start_soon(store.sweep)
        await store.wait_ready(ready_wait_s)
        try:
            yield store
        finally:
            tg.cancel_scope.cancel()


@asynccontextmanager
async def connect_group_store(
    url: str, group: str, *, name: str = "mqgw", ready_wait_s: float = 30.0
) -> AsyncIterator[GroupStore]:
    """``open_group_store`` over its own Redis connection to ``url``; TimeoutError when the
    group has no master within ``ready_wait_s``."""
    client: Redis = async_client(url, connect_timeout_s=1.0, socket_timeout_s=2.0)
    try:
        async with open_group_store(
            GroupLink(client), group, name=name, ready_wait_s=ready_wait_s
        ) as store:
            yield store
    finally:
        with anyio.CancelScope(shield=True):
            await client.aclose()
