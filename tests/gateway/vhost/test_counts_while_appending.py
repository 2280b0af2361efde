"""A queue's ready count while an append it is part of waits for the store (its fsync): a
basic.get that runs meanwhile may read what was just written. The count must already hold
it, or the get takes it out of a count that never had it: below zero, which a get-ok's
message-count cannot carry (the connection closed with 541 in a CI run, a shrink's command
record read by a get while its append waited)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from gateway.queues.runtime import QueueRuntime
from gateway.queues.scheduler import PushScheduler
from gateway.vhost import VirtualHost, elastic
from meta.local_store import LocalMetadataStore
from meta.models import QueueDef, VHost
from storage import (
    AppendResult,
    EmbeddedStore,
    FlushPolicy,
    Record,
    StoreConfig,
    open_embedded_store,
)
from tests.harness.clock import FakeClock

Hook = Callable[[Sequence[Record]], Awaitable[None]]


class GetDuringAppend:
    """The embedded store, running ``during`` once an append's records are written and
    before the append returns (as the fsync's wait lets other tasks run)."""

    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store
        self.during: Hook | None = None

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def append(self, records: Sequence[Record], wait_durable: bool = True) -> AppendResult:
        result = await self.store.append(records, wait_durable)
        if self.during is not None:
            await self.during(records)
        return result


async def _host(tmp_path: Path, store: GetDuringAppend) -> VirtualHost:
    meta = LocalMetadataStore(tmp_path / "meta")
    await meta.add_vhost(VHost(name="/"))
    host = VirtualHost("/", meta, store, PushScheduler(clock=FakeClock()), 1)  # type: ignore[arg-type]
    await host.load()
    return host


def _message(queue: QueueRuntime, partition: int, body: bytes) -> Record:
    return Record(b"", queue.name.encode(), b"\x00\x00", body, ((queue.queue_id, partition),))


async def _get_body(queue: QueueRuntime) -> bytes | None:
    taken = await queue.get()
    if taken is None:
        return None
    partition, message, _ = taken
    queue.settle(partition, message)
    return bytes(message.body)


@asynccontextmanager
async def _one_queue(
    tmp_path: Path,
) -> AsyncIterator[tuple[VirtualHost, QueueRuntime, GetDuringAppend]]:
    """A vhost on the embedded store with queue "q" started (``store.during``: see
    ``_get_now``)."""
    config = StoreConfig(tmp_path / "store", flush=FlushPolicy.ASYNC)
    async with open_embedded_store(config) as inner:
        store = GetDuringAppend(inner)
        host = await _host(tmp_path, store)
        queue = await host.declare_queue(QueueDef(vhost="/", name="q"), False, "c")
        await queue.start()
        yield host, queue, store


def _get_now(
    queue: QueueRuntime, store: GetDuringAppend, seen: list[tuple[bytes | None, int]]
) -> Hook:
    """For ``store.during``: the next append runs a basic.get on ``queue`` once its records
    are written (the body and the count after it, into ``seen``)."""

    async def get_now(records: Sequence[Record]) -> None:
        store.during = None
        seen.append((await _get_body(queue), await queue.message_count()))

    return get_now


def test_a_get_during_a_shrinks_command_append_counts_from_zero(tmp_path: Path) -> None:
    seen: list[tuple[bytes | None, int]] = []

    async def scenario() -> None:
        async with _one_queue(tmp_path) as (host, queue, store):
            await elastic.scale(host, queue, 2)
            await host.append([_message(queue, 0, b"m")])
            assert await queue.message_count() == 1
            store.during = _get_now(queue, store, seen)
            await elastic.scale(host, queue, 1)  # partition 1 closes: its command record
            assert queue.route is not None
            assert [p.state for p in queue.route.partitions] == ["open", "draining"]
            seen.append((await _get_body(queue), await queue.message_count()))

    anyio.run(scenario)
    # The get ran while the command record's append waited: it read the message and the
    # record (never delivered); nothing is left, and no count went below zero.
    assert seen == [(b"m", 0), (None, 0)]


def test_a_get_during_a_dead_letter_or_tx_append_counts_from_zero(tmp_path: Path) -> None:
    seen: list[tuple[bytes | None, int]] = []

    async def scenario() -> None:
        async with _one_queue(tmp_path) as (host, queue, store):
            store.during = _get_now(queue, store, seen)
            await host.append([_message(queue, 0, b"a"), _message(queue, 0, b"b")])
            seen.append((await _get_body(queue), await queue.message_count()))
            seen.append((await _get_body(queue), await queue.message_count()))

    anyio.run(scenario)
    assert seen == [(b"a", 1), (b"b", 0), (None, 0)]
