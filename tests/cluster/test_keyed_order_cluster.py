"""A keyed-order queue on a cluster of two gateways (redis-server, a broker, `mqgw serve
--meta`), its route fixed: publishers on both gateways; consumers on one, then on the other
while the first ones leave mid-stream (the delivery leases change gateway). Every key's
messages arrive in publish order, once each but for flagged redeliveries, and each partition
is delivered by one gateway at a time (rescaling on a cluster: test_keyed_rescale_cluster.py).
A move to a broker group the cluster does not have is refused with 400."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.servers import GatewayServer
from tests.cluster.conftest import Cluster, running_cluster
from tests.compat.test_keyed_order import Arrivals, consumer, declare, publish_aio

KEYED = {"x-mqgw-ordering": "key", "x-mqgw-partitions": 4, "x-mqgw-ordering-header": "account"}


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path, ("gwA", "gwB")) as made:
        yield made


def holding(gateway: GatewayServer) -> list[bool]:
    """Per partition, whether a consumer on ``gateway`` holds it."""
    status, shown = gateway.admin("GET", "/api/queues/%2F/orders/route")
    assert status == 200, shown
    return [p["consumer"] is not None for p in shown["partitions"]]


def test_per_key_order_while_the_partitions_change_gateway(pair: Cluster) -> None:
    gw_a, gw_b = pair.gateways
    declare(gw_a.url, "orders", KEYED)
    per_key, half = 24, 12
    held: list[list[bool]] = []

    async def publish(first: int, last: int) -> None:
        await asyncio.gather(publish_aio(gw_a.url, "orders", "pa", last, first),
                             publish_aio(gw_b.url, "orders", "pb", last, first))  # fmt: skip

    async def scenario() -> Arrivals:
        arrivals = Arrivals()
        stop_a, stop_b = asyncio.Event(), asyncio.Event()
        on_a = [asyncio.create_task(consumer(gw_a.url, "orders", name, arrivals, stop_a,
                                             requeue_every=29 if name == "a1" else 0))
                for name in ("a1", "a2")]  # fmt: skip
        await asyncio.sleep(1.0)  # gwA takes the delivery leases (renewed every second)
        await publish(0, half)
        on_b = [asyncio.create_task(consumer(gw_b.url, "orders", name, arrivals, stop_b))
                for name in ("b1", "b2")]  # fmt: skip
        stop_a.set()  # gwA's consumers leave with messages in flight: the leases go to gwB
        await asyncio.gather(*on_a)
        await publish(half, per_key)
        await arrivals.wait_for(2 * 40 * per_key, 60)
        held.extend(await asyncio.to_thread(lambda: [holding(gw_a), holding(gw_b)]))
        stop_b.set()
        await asyncio.gather(*on_b)
        return arrivals

    arrivals = asyncio.run(scenario())
    arrivals.check([f"{tag}-{k}" for tag in ("pa", "pb") for k in range(40)], per_key)
    by = {name for name, _, _ in arrivals.seen}
    assert {"a1", "b1"} <= by or {"a2", "b2"} <= by, by  # both gateways delivered
    assert held == [[False] * 4, [True] * 4]  # in the end gwB delivers every partition

    status, body = gw_b.admin("POST", "/api/queues/%2F/orders/rescale", {"move": 0, "to": "g7"})
    assert status == 400 and "no broker group 'g7' up in the cluster (up: g1)" in body["reason"]
    status, route = gw_a.admin("GET", "/api/queues/%2F/orders/route")
    assert status == 200 and route["version"] == 1 and route["open_partitions"] == 4
