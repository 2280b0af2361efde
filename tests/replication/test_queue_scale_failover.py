"""Faults in the middle of a plain queue's scaling on a replicated broker group
(docs/elastic-queues.md): the master killed -9 while the queue grows 1 → 4 under pika
publishers with confirms on two gateways, and the controller killed (a second one takes
over) then the new master killed while it shrinks back to 2. Each change completes on the
survivors, every confirmed message arrives, nothing is written after a command record, and
nothing holds the log back on the last master."""

from __future__ import annotations

from typing import Any

import anyio
import pika
import pytest

from bench.servers import GatewayServer, check_for
from storage import QUEUE_GROUP, connect_remote_store
from tests.harness.confirming_clients import AckingConsumer, ChannelPublishers
from tests.replication.conftest import Group
from tests.replication.test_keyed_rescale_failover import settled_route

pytestmark = [
    pytest.mark.slow,
    pytest.mark.anyio,
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]


def settled(gateway: GatewayServer, timeout_s: float = 60) -> dict[str, Any]:
    return settled_route(gateway, timeout_s, queue="elastic")


def ask(gateway: GatewayServer, partitions: int) -> None:
    status, answer = gateway.admin("POST", "/api/queues/%2F/elastic/scale",
                                   {"partitions": partitions})  # fmt: skip
    assert status in (200, 202), answer


async def test_master_and_controller_killed_while_a_queue_scales(group: Group) -> None:
    c1 = group.add_controller("c1")
    group.add_controller("c2")
    group.add_broker("a")
    group.add_broker("b")
    group.add_broker("c")
    first = await group.until(lambda r: r.master != "" and len(r.in_sync) == 3)
    gw_a, gw_b = group.add_gateway("gwA"), group.add_gateway("gwB")
    with pika.BlockingConnection(pika.URLParameters(gw_a.url)) as conn:
        conn.channel().queue_declare("elastic", durable=True)
    consumers = [AckingConsumer(gw.url, "elastic") for gw in (gw_a, gw_b)]
    publishers = [ChannelPublishers(gw.url, "elastic", gw.data_dir.name) for gw in (gw_a, gw_b)]
    for worker in (*consumers, *publishers):
        worker.start()
    check_for(10, lambda: all(len(p.confirmed) > 100 for p in publishers))

    ask(gw_a, 4)
    group.master(first).kill()  # in the middle of the grow
    route = settled(gw_b)
    assert [p["state"] for p in route["partitions"]] == ["open"] * 4, route
    second = await group.until(lambda r: r.master not in ("", first.master))
    check_for(20, lambda: all(len(p.confirmed) > 400 for p in publishers))

    ask(gw_b, 2)
    c1.kill()  # the controller, then the new master, while it shrinks
    group.master(second).kill()
    route = settled(gw_a, timeout_s=90)
    states = [p["state"] for p in route["partitions"]]
    assert states == ["open", "open", "removed", "removed"], route
    third = await group.until(lambda r: r.master not in ("", first.master, second.master))
    marks = [len(p.confirmed) for p in publishers]
    pairs = list(zip(publishers, marks, strict=True))
    check_for(20, lambda: all(len(p.confirmed) > m + 100 for p, m in pairs))
    for publisher in publishers:
        publisher.stop.set()
        publisher.join(10)
    confirmed = {b for p in publishers for b in p.confirmed}
    check_for(60, lambda: confirmed <= {b for c in consumers for b, _ in c.received})
    for consumer in consumers:
        consumer.stop.set()
        consumer.join(10)
    assert sum(p.nacked for p in publishers) == 0

    async with connect_remote_store(group.master(third).address) as store:
        (queue_id,) = [q for q, n in (await store.queues()).items() if n == 4]
        stats = await store.queue_stats(queue_id)
        for part in route["partitions"]:  # nothing written after a command record
            if part["state"] == "removed":
                assert stats.partitions[part["partition"]].max_offset == part["closed_at"] + 1
        # Nothing holds the log back: the holder's last commits reach the broker within a
        # commit interval (a second) of the last ack.
        behind: dict[int, tuple[int, int]] = {}
        for _ in range(100):
            behind = {
                s.partition: (await store.committed_offset(QUEUE_GROUP, queue_id, s.partition),
                              s.max_offset)
                for s in stats.partitions
            }  # fmt: skip
            if all(committed >= end for committed, end in behind.values()):
                break
            await anyio.sleep(0.1)
    assert all(committed >= end for committed, end in behind.values()), behind
