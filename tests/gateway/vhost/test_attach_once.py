"""A queue gets one runtime, and a vhost one VirtualHost, however their declaration reaches
the gateway. In a cluster the change feed brings a gateway's own queue.declare back, often
while that declaration is still attaching (awaiting the broker); a second runtime used to
replace the first, and the consumer registered on the first was never served
(tests/cluster/test_no_duplicates.py saw it as a warm-up message never delivered, about one
run in five)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio

from gateway.config.settings import GatewaySettings
from gateway.node import Node
from gateway.node.metadata_sync import apply_change
from gateway.queues.runtime import QueueRuntime
from gateway.queues.scheduler import PushScheduler
from gateway.vhost import VirtualHost
from meta.change_feed import change
from meta.local_store import LocalMetadataStore
from meta.models import QueueDef, VHost
from storage import EmbeddedStore, FlushPolicy, StoreConfig, open_embedded_store


class _Held:
    """``inner`` with its method ``name`` held until ``let_go`` is set (a round trip to a
    broker, or to Redis, in a cluster)."""

    def __init__(self, inner: Any, name: str) -> None:
        self._inner = inner
        self._name = name
        self.let_go = anyio.Event()
        self.calls = 0

    def __getattr__(self, attribute: str) -> Any:
        method = getattr(self._inner, attribute)
        if attribute != self._name:
            return method

        async def held(*args: Any) -> Any:
            self.calls += 1
            await self.let_go.wait()
            return await method(*args)

        return held


@asynccontextmanager
async def _store(tmp_path: Path) -> AsyncIterator[EmbeddedStore]:
    config = StoreConfig(tmp_path / "store", flush=FlushPolicy.ASYNC)
    async with open_embedded_store(config) as store:
        yield store


async def _vhost(meta: Any, store: Any) -> VirtualHost:
    vhost = VirtualHost("/", meta, store, PushScheduler(), partitions=1)
    await vhost.load()
    return vhost


async def _race(
    held: _Held, first: Callable[[], Awaitable[object]], second: Callable[[], Awaitable[object]]
) -> None:
    """``first`` until it waits on the held call, then ``second`` as far as it goes; then the
    held call answers."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        while held.calls == 0:
            await anyio.lowlevel.checkpoint()
        tg.start_soon(second)
        for _ in range(20):
            await anyio.lowlevel.checkpoint()
        held.let_go.set()


def test_a_declaration_heard_back_while_attaching_keeps_one_runtime(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with _store(tmp_path) as embedded:
            store = _Held(embedded, "create_queue")
            meta = LocalMetadataStore(tmp_path / "meta")
            vhost = await _vhost(meta, store)
            got: dict[str, QueueRuntime] = {}

            async def declare() -> None:
                got["declared"] = await vhost.declare_queue(
                    QueueDef(vhost="/", name="work"), False, "c"
                )

            async def feed_echo() -> None:
                (definition,) = await meta.list_queues("/")
                await vhost.adopt_queue(definition)
                got["adopted"] = vhost.queues["work"]

            await _race(store, declare, feed_echo)
            assert store.calls == 1
            assert got["declared"] is got["adopted"] is vhost.queues["work"]
            assert vhost.queues_by_id == {got["declared"].queue_id: got["declared"]}

    anyio.run(scenario)


def test_a_runtime_of_an_older_queue_of_the_name_is_replaced(tmp_path: Path) -> None:
    """A delete this gateway missed: the new declaration (a new id) gets a new runtime."""

    async def scenario() -> None:
        async with _store(tmp_path) as store:
            meta = LocalMetadataStore(tmp_path / "meta")
            vhost = await _vhost(meta, store)
            old = await vhost.declare_queue(QueueDef(vhost="/", name="work"), False, "c")
            await meta.delete_queue("/", "work", "c")  # elsewhere: this runtime never hears it
            new = await vhost.declare_queue(QueueDef(vhost="/", name="work"), False, "c")
            assert new is not old and new.queue_id != old.queue_id
            assert old.deleted and vhost.queues_by_id == {new.queue_id: new}

    anyio.run(scenario)


def test_a_vhost_added_and_heard_back_while_opening_is_opened_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with _store(tmp_path) as store:
            meta = _Held(LocalMetadataStore(tmp_path / "meta"), "list_queues")
            node = Node(GatewaySettings(data_dir=tmp_path), store, meta)
            await _race(
                meta,
                lambda: node.add_vhost(VHost(name="orders")),
                lambda: node.open_vhost("orders"),  # the feed's vhost.added
            )
            opened = node.vhosts["orders"]
            assert meta.calls == 1
            assert await node.open_vhost("orders") is opened

    anyio.run(scenario)


def test_a_declaration_heard_back_after_the_queue_was_deleted_stays_deleted(
    tmp_path: Path,
) -> None:
    """A reply queue declared and deleted at once: the feed's queue.declared arrives after
    the delete, and must neither bring a runtime back nor create the queue in the store."""

    async def scenario() -> None:
        async with _store(tmp_path) as store:
            vhost = await _vhost(LocalMetadataStore(tmp_path / "meta"), store)
            queue = await vhost.declare_queue(QueueDef(vhost="/", name="reply"), False, "c")
            definition = queue.definition
            await vhost.delete_queue("reply", "c")
            await vhost.adopt_queue(definition)  # the echo of the declaration, late
            assert "reply" not in vhost.queues and vhost.queues_by_id == {}
            assert definition.queue_id not in await store.queues()

    anyio.run(scenario)


def test_a_declaration_heard_after_another_gateway_deleted_the_queue_is_not_attached(
    tmp_path: Path,
) -> None:
    """The feed's queue.declared reaches a gateway after the queue was declared and deleted
    on another one: nothing is attached, nothing created in the store."""

    async def scenario() -> None:
        async with _store(tmp_path) as store:
            meta = LocalMetadataStore(tmp_path / "meta")
            node = Node(GatewaySettings(data_dir=tmp_path), store, meta)
            vhost = await node.open_vhost("/")
            declared = await meta.declare_queue(QueueDef(vhost="/", name="reply"), False, "c")
            await meta.delete_queue("/", "reply", "c")  # both on the other gateway
            await apply_change(node, change("queue.declared", declared))
            assert vhost.queues == {} and declared.queue_id not in await store.queues()
            live = await meta.declare_queue(QueueDef(vhost="/", name="live"), False, "c")
            await apply_change(node, change("queue.declared", live))  # still there: attached
            assert vhost.queues["live"].queue_id == live.queue_id

    anyio.run(scenario)
