"""A rescale step interrupted between its two writes (docs/ordering.md, "Faults"), on the real
vhost, embedded store and metadata file across a restart:

- the route's version written, the command record not (the gateway stopped in between): the
  next start appends it and the step completes, per-key order and every message kept;
- the command record appended, the route not (its write failed): the record is inert, the
  queue goes on under the old version, nothing is lost or delivered twice."""

from __future__ import annotations

from pathlib import Path

import anyio

from gateway.queues.ordered import OrderedRuntime
from gateway.queues.scheduler import PushScheduler
from gateway.vhost.host import VirtualHost
from gateway.vhost.keyed_routes import command_record
from gateway.vhost.rescale import REMOVED_CHECK_S, RouteKeeper, settled
from meta.local_store import LocalMetadataStore
from meta.models import QueueDef, VHost
from meta.queue_route import split
from storage import QUEUE_GROUP, EmbeddedStore, FlushPolicy, StoreConfig, open_embedded_store
from tests.gateway.queues.test_ordered_model import KEYED, World
from tests.harness.clock import FakeClock

DEFINITION = QueueDef(vhost="/", name="orders", durable=True, arguments=KEYED)


async def _open(
    data: Path, store: EmbeddedStore
) -> tuple[VirtualHost, OrderedRuntime, LocalMetadataStore]:
    """The vhost on ``store`` and the metadata file under ``data`` (again: a restart)."""
    meta = LocalMetadataStore(data / "meta")
    if await meta.get_vhost("/") is None:
        await meta.add_vhost(VHost(name="/"))
    host = VirtualHost("/", meta, store, PushScheduler(clock=FakeClock()), 1)
    await host.load()
    queue = host.queues.get("orders") or await host.declare_queue(
        host.with_partitions(DEFINITION), False, ""
    )
    assert isinstance(queue, OrderedRuntime)
    return host, queue, meta


async def _published(data: Path, store: EmbeddedStore, keys: list[str]) -> World:
    """A first start, and ``keys`` published (one message each, in order)."""
    host, queue, _meta = await _open(data, store)
    world = World(host, queue, RouteKeeper(lambda: [(host, queue)]))
    world.route_batch(keys)
    await world.append_oldest()
    return world


def _restarted(world: World, host: VirtualHost, queue: OrderedRuntime) -> None:
    world.host, world.queue = host, queue
    world.keeper = RouteKeeper(lambda: [(host, queue)])
    world.consumers = []


async def _drain(world: World) -> None:
    await world.finish()
    assert settled(world.queue, world.keeper)


def test_a_version_written_without_its_command_record_completes_at_the_next_start(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        config = StoreConfig(tmp_path / "store", flush=FlushPolicy.ASYNC)
        async with open_embedded_store(config) as store:
            world = await _published(tmp_path, store, [f"k{i % 5}" for i in range(20)])
            meta, queue = world.host.meta, world.queue
            # The step's first write, then a stop: version 2 says partition 0 is closing.
            route = queue.route
            new = split(route, 0, when="t")
            await store.create_queue(queue.queue_id, len(new.partitions))
            await meta.set_route(new, route)
            await meta.close()

            host, queue, meta = await _open(tmp_path, store)  # the restart
            part = queue.route.partitions[0]
            assert (queue.route.version, part.state, part.closed_at) == (2, "draining", 20)
            _restarted(world, host, queue)
            world.route_batch([f"k{i % 5}" for i in range(20)])  # version 2: new partitions
            await world.append_oldest()
            await _drain(world)
            world.check()  # each key: 0..7 in order, the old partition's first
            assert [p.state for p in queue.route.partitions] == ["removed", "open", "open"]
            await meta.close()

    anyio.run(scenario)


def test_a_command_record_without_its_version_is_inert(tmp_path: Path) -> None:
    async def scenario() -> None:
        config = StoreConfig(tmp_path / "store", flush=FlushPolicy.ASYNC)
        async with open_embedded_store(config) as store:
            world = await _published(tmp_path, store, [f"k{i % 3}" for i in range(9)])
            queue = world.queue
            # The record went in; the route's write failed: version 1 goes on.
            await store.append([command_record(queue.queue_id, 0, 2, 0)])
            world.route_batch([f"k{i % 3}" for i in range(9)])
            await world.append_oldest()
            await world.host.meta.close()

            host, queue, meta = await _open(tmp_path, store)
            assert queue.route.version == 1 and queue.ready_count == 19  # with the record
            _restarted(world, host, queue)
            await _drain(world)
            world.check()  # 18 messages, each key 0..5 in order, the record never delivered
            assert len(world.session.deliveries) == 18
            assert queue.ready_count == 0
            await meta.close()

    anyio.run(scenario)


def test_a_removed_partition_committed_below_its_record_is_committed_past_it(
    tmp_path: Path,
) -> None:
    """After a broker failover lost a removal's last commits (the committed offset set back
    here by hand), the keeper commits the partition past its command record, so it holds no
    log back: at once on the embedded node; on a cluster by taking its lease for a moment,
    delivering nothing of it."""

    async def scenario() -> None:
        config = StoreConfig(tmp_path / "store", flush=FlushPolicy.ASYNC)
        async with open_embedded_store(config) as store:
            world = await _published(tmp_path, store, [f"k{i % 5}" for i in range(20)])
            queue = world.queue
            await world.rescale("split", 0)
            await _drain(world)
            part = queue.route.partitions[0]
            assert part.state == "removed" and part.closed_at == 20
            committed = lambda: store.committed_offset(QUEUE_GROUP, queue.queue_id, 0)  # noqa: E731
            assert await committed() == 21

            now = [0.0]
            keeper = RouteKeeper(lambda: [(world.host, queue)], now=lambda: now[0])
            await store.commit_offset(QUEUE_GROUP, queue.queue_id, 0, 7)
            await keeper.check_removed(world.host, queue)
            assert await committed() == 21  # the embedded node: at once

            queue.start_leasing()  # as on a cluster: the lease path
            queue.fences[0] = 9
            await store.commit_offset(QUEUE_GROUP, queue.queue_id, 0, 7)
            now[0] = REMOVED_CHECK_S - 1
            await keeper.check_removed(world.host, queue)
            assert queue.behind_removed == set()  # not looked at again before its time
            now[0] = REMOVED_CHECK_S
            await keeper.check_removed(world.host, queue)
            assert queue.behind_removed == {0} and queue.wants_partition(0)
            delivered = len(world.session.deliveries)
            await queue.take_over(0)  # the link took its lease
            assert await committed() == 21
            assert queue.behind_removed == set() and not queue.wants_partition(0)
            assert 0 not in queue.readable and len(world.session.deliveries) == delivered
            await world.host.meta.close()

    anyio.run(scenario)
