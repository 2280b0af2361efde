"""Two gateways' vhosts over one metadata file and one store that refuses appends to closed
partitions as a broker does (docs/ordering.md, "In a cluster"): a change made on one
gateway closes a partition; a batch the other routed by the old version is refused there,
re-read, routed again and stored in the new partition, before anything is confirmed. A
refusal of an open partition (a length limit) stays a refusal; with the metadata store
away the refused batch waits, then is nacked."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from gateway.queues.ordered import OrderedRuntime
from gateway.queues.scheduler import PushScheduler
from gateway.vhost import keyed_routes
from gateway.vhost.host import VirtualHost
from gateway.vhost.rescale import Step, apply_step
from meta.errors import MetaError
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
from storage.log.closed_partitions import refuse_closed
from tests.harness.clock import FakeClock

KEYED = {"x-mqgw-ordering": "key", "x-mqgw-logical-partitions": 64}
DEFINITION = QueueDef(vhost="/", name="orders", durable=True, arguments=KEYED)


class BrokerLike:
    """The embedded store with a broker's refusal of closed partitions (a fake in a unit
    test; tests/storage/test_closed_partitions.py holds the real broker to it)."""

    def __init__(self, store: EmbeddedStore, also_refuse: set[tuple[int, int]]) -> None:
        self.store = store
        self.also_refuse = also_refuse  # stands for a length limit on these partitions

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    async def append(self, records: Sequence[Record], wait_durable: bool = True) -> AppendResult:
        closed = self.store.log.closed | self.also_refuse
        kept, refused = refuse_closed(records, closed)
        result = await self.store.append(kept, wait_durable)
        if refused:
            return result._replace(record_offsets=(), queue_starts=None, refused=tuple(refused))
        return result


async def _host(meta: LocalMetadataStore, store: BrokerLike) -> tuple[VirtualHost, OrderedRuntime]:
    host = VirtualHost("/", meta, store, PushScheduler(clock=FakeClock()), 1)  # type: ignore[arg-type]
    await host.load()
    queue = host.queues.get("orders") or await host.declare_queue(
        host.with_partitions(DEFINITION), False, ""
    )
    assert isinstance(queue, OrderedRuntime)
    return host, queue


def _records(queue: OrderedRuntime, keys: list[str]) -> list[Record]:
    return [
        Record(
            b"",
            k.encode(),
            b"\x00\x00",
            f"{k}:{i}".encode(),
            ((queue.queue_id, queue.key_partition(k, None)),),
        )
        for i, k in enumerate(keys)
    ]


async def _bodies(store: EmbeddedStore, queue_id: int, partition: int) -> list[str]:
    read = await store.read(queue_id, partition, 0, 1000)
    return [bytes(m.body).decode() for m in read.messages if m.exchange == b""]


@asynccontextmanager
async def two_gateways(
    tmp_path: Path,
) -> AsyncIterator[
    tuple[BrokerLike, tuple[VirtualHost, OrderedRuntime], tuple[VirtualHost, OrderedRuntime]]
]:
    """One store, one metadata file, the keyed queue attached on two gateways' vhosts."""
    async with open_embedded_store(StoreConfig(tmp_path / "s", flush=FlushPolicy.ASYNC)) as inner:
        store = BrokerLike(inner, set())
        meta = LocalMetadataStore(tmp_path / "meta")
        await meta.add_vhost(VHost(name="/"))
        yield store, await _host(meta, store), await _host(meta, store)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_a_batch_routed_by_the_old_version_lands_in_the_new_partition(
    tmp_path: Path,
) -> None:
    async with two_gateways(tmp_path) as (store, (host_a, queue_a), (host_b, queue_b)):
        inner = store.store
        stale = _records(queue_b, ["k1", "k2", "k3"])  # gateway B routed by version 1
        await apply_step(host_a, queue_a, Step("split", 0))  # gateway A closes partition 0
        assert queue_b.route.version == 1
        result = await host_b.append_routed(stale, wait_durable=False)
        assert result.refused == ()
        assert queue_b.route.version == queue_a.route.version == 2  # B read it again
        assert host_b.route_epoch == 1
        landed = sorted(await _bodies(inner, queue_b.queue_id, 1) +
                        await _bodies(inner, queue_b.queue_id, 2))  # fmt: skip
        assert landed == ["k1:0", "k2:1", "k3:2"]
        assert await _bodies(inner, queue_b.queue_id, 0) == []  # nothing after the record

        # A refusal of an open partition is not a closure: it stays refused (a nack).
        open_part = queue_b.key_partition("k1", None)
        store.also_refuse.add((queue_b.queue_id, open_part))
        limited = await host_b.append_routed(_records(queue_b, ["k1"]), wait_durable=False)
        assert limited.refused == ((0, queue_b.queue_id, open_part),)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.anyio
async def test_with_the_metadata_store_away_a_refused_batch_waits_then_is_nacked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with two_gateways(tmp_path) as (_store, (host_a, queue_a), (host_b, queue_b)):
        meta = host_b.meta
        stale = _records(queue_b, ["k1"])
        await apply_step(host_a, queue_a, Step("split", 0))
        looks = 0

        async def away(*_args: object) -> None:
            nonlocal looks
            looks += 1
            raise MetaError("metadata store unreachable")

        monkeypatch.setattr(meta, "get_route", away)
        monkeypatch.setattr(keyed_routes, "ROUTE_WAIT_S", 0.3)
        monkeypatch.setattr(keyed_routes, "ROUTE_RETRY_S", 0.05)
        with anyio.fail_after(5):
            result = await host_b.append_routed(stale, wait_durable=False)
        assert result.refused == ((0, queue_b.queue_id, 0),)  # nacked, not lost silently
        assert looks >= 3  # it looked again while it waited
        assert queue_b.route.version == 1
