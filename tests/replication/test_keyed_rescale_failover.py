"""Faults in the middle of a keyed-order queue's rescale on a replicated broker group
(docs/ordering.md, "In a cluster"): the master killed -9 while the queue splits 1 → 4 under
publishers on two gateways, and Redis restarted while it merges back. The change completes
on the survivors, every key's messages arrive in publish order, exactly once but for
flagged redeliveries, and nothing is left in a removed partition."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from bench.servers import GatewayServer, check_for
from storage import QUEUE_GROUP, connect_remote_store
from tests.cluster.test_keyed_rescale_cluster import declare, keys_of, publish_aio, settled_counts
from tests.compat.test_keyed_order import Arrivals, consumer
from tests.replication.conftest import Group

pytestmark = [
    pytest.mark.slow,
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]
KEYS, PER_KEY = 100, 60


def settled_route(
    gateway: GatewayServer, timeout_s: float = 60, queue: str = "orders"
) -> dict[str, Any]:
    """The route once no change is in progress and no count is still to reach."""
    deadline = time.monotonic() + timeout_s
    route: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            status, route = gateway.admin("GET", f"/api/queues/%2F/{queue}/route")
        except OSError:
            status = 0
        if status == 200 and route["in_progress"] is None and route["target_partitions"] is None:
            return route
        time.sleep(0.1)
    raise AssertionError(f"the change did not settle: {route}")


def ask(gateway: GatewayServer, body: dict[str, Any]) -> None:
    status, answer = gateway.admin("POST", "/api/queues/%2F/orders/rescale", body)
    assert status in (200, 202), answer


async def test_master_kill_and_redis_restart_in_the_middle_of_rescales(group: Group) -> None:
    group.add_controller("c1")
    group.add_broker("a")
    group.add_broker("b")
    first = await group.until(lambda r: r.master != "" and len(r.in_sync) == 2)
    gw_a, gw_b = group.add_gateway("gwA"), group.add_gateway("gwB")
    declare(gw_a, "orders")
    arrivals = Arrivals()
    stop = asyncio.Event()
    consumers = [
        asyncio.create_task(consumer(gw.url, "orders", f"{gw.data_dir.name}-{i}", arrivals, stop))
        for gw in (gw_a, gw_b)
        for i in range(2)
    ]
    faults: list[str] = []
    restart_redis = threading.Event()

    def operator() -> None:
        time.sleep(1.0)
        ask(gw_a, {"partitions": 4})
        group.master(first).kill()  # while the steps run: the keepers go on after failover
        faults.append("master killed")
        route = settled_route(gw_b)
        assert len([p for p in route["partitions"] if p["range"]]) == 4, route
        ask(gw_b, {"partitions": 2})
        group.redis.stop()
        time.sleep(1.0)
        restart_redis.set()  # by the main thread: a server dies with the thread starting it
        while "redis restarted" not in faults:
            time.sleep(0.05)
        route = settled_route(gw_a)
        assert len([p for p in route["partitions"] if p["range"]]) == 2, route

    thread = threading.Thread(target=operator)

    async def on_the_main_thread() -> None:
        while thread.is_alive():
            if restart_redis.is_set():
                restart_redis.clear()
                group.redis.start()
                faults.append("redis restarted")
            await asyncio.sleep(0.05)

    thread.start()
    try:
        await asyncio.gather(
            publish_aio(gw_a.url, "orders", "pa", KEYS, PER_KEY),
            publish_aio(gw_b.url, "orders", "pb", KEYS, PER_KEY),
            on_the_main_thread(),
        )
    finally:
        for gateway in (gw_a, gw_b):  # what a failure needs to be understood
            print(f"--- {gateway.data_dir.name}:\n" + "".join(gateway.log_lines[-80:]))
    await arrivals.wait_for(2 * KEYS * PER_KEY, 60)
    stop.set()
    await asyncio.gather(*consumers)
    assert faults == ["master killed", "redis restarted"]
    arrivals.check([*keys_of("pa", KEYS), *keys_of("pb", KEYS)], PER_KEY)
    for gateway in (gw_a, gw_b):  # the holder's last commits reach the broker soon after
        check_for(10, lambda g=gateway: settled_counts(g), what=f"{gateway.data_dir.name} at 0")
    # Nothing holds the log back: every partition's committed offset on the new master is
    # past what it holds (a removed one's past its command record), so its bytes can go.
    _, route = gw_a.admin("GET", "/api/queues/%2F/orders/route")
    record = await group.record()
    async with connect_remote_store(group.brokers[record.master].address) as store:
        (queue_id,) = [
            q for q, n in (await store.queues()).items() if n == len(route["partitions"])
        ]
        stats = await store.queue_stats(queue_id)
        behind = {
            s.partition: (
                await store.committed_offset(QUEUE_GROUP, queue_id, s.partition),
                s.max_offset,
            )
            for s in stats.partitions
        }
    assert all(committed == end for committed, end in behind.values()), behind
