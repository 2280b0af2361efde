"""Rescaling a keyed-order queue on a cluster (redis-server, two unreplicated broker groups, two
`mqgw serve --meta` gateways; docs/ordering.md): publishers on pika, kombu and aio-pika
spread over both gateways, two aio-pika consumers on each, while operators on either gateway
take the queue 1 → 4 → 8 partitions, move one to the other broker group, and go down to 2.
Every key's messages arrive in publish order, exactly once but for flagged redeliveries.
A publisher on the gateway that did not make a change learns of it from the broker, which
refuses appends after a command record; the slow tier runs 200,000 messages over 1,000
keys, and the same with the gateway making a split killed in the middle of it."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import aio_pika
import anyio
import kombu
import pika
import pytest

from bench.servers import GatewayServer, check_for
from storage import connect_remote_store
from tests.cluster.conftest import TwoGroups
from tests.compat.test_keyed_order import Arrivals, consumer

HEADER = "account"
SHOWN = ("partition", "group", "state", "closed_at", "range", "gate", "delivered_here", "held",
         "unacked", "read_to", "committed", "consumer", "orphaned")  # fmt: skip
KEYED = {"x-mqgw-ordering": "key", "x-mqgw-partitions": 1, "x-mqgw-logical-partitions": 1024,
         "x-mqgw-ordering-header": HEADER}  # fmt: skip


def keys_of(tag: str, keys: int) -> list[str]:
    return [f"{tag}-{k}" for k in range(keys)]


def publish_pika(url: str, queue: str, tag: str, keys: int, per_key: int) -> None:
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        for n in range(per_key):
            for key in keys_of(tag, keys):
                props = pika.BasicProperties(delivery_mode=2, headers={HEADER: key})
                channel.basic_publish("", queue, f"{key}:{n}".encode(), props)


def publish_kombu(url: str, queue: str, tag: str, keys: int, per_key: int) -> None:
    with kombu.Connection(url.replace("amqp://", "pyamqp://")) as conn:
        producer = conn.Producer()
        for n in range(per_key):
            for key in keys_of(tag, keys):
                producer.publish(f"{key}:{n}", routing_key=queue, exchange="", serializer=None,
                                 content_type="text/plain", headers={HEADER: key},
                                 delivery_mode=2)  # fmt: skip


def message(key: str, n: int) -> aio_pika.Message:
    return aio_pika.Message(f"{key}:{n}".encode(), headers={HEADER: key},
                            delivery_mode=aio_pika.DeliveryMode.PERSISTENT)  # fmt: skip


async def publish_aio(url: str, queue: str, tag: str, keys: int, per_key: int) -> None:
    conn = await aio_pika.connect(url)
    async with conn:
        channel = await conn.channel(publisher_confirms=True)
        for n in range(per_key):
            sent = [
                channel.default_exchange.publish(message(key, n), routing_key=queue)
                for key in keys_of(tag, keys)
            ]
            await asyncio.gather(*sent)  # one round of keys in flight: per-key order kept


def noting(errors: list[BaseException], work: Callable[[], None]) -> Callable[[], None]:
    """``work`` for a thread, its exception kept for the test to assert on."""

    def run() -> None:
        try:
            work()
        except BaseException as error:
            errors.append(error)
            raise

    return run


def broker_ends(cluster: TwoGroups, group: str) -> dict[int, list[int]]:
    """Per queue on ``group``'s broker, each partition's end offset."""

    async def ask() -> dict[int, list[int]]:
        async with connect_remote_store(cluster.brokers[group].address) as store:
            ends = {}
            for queue_id in await store.queues():
                stats = await store.queue_stats(queue_id)
                ends[queue_id] = [p.max_offset for p in stats.partitions]
            return ends

    return anyio.run(ask)


def declare(gateway: GatewayServer, queue: str) -> None:
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
        conn.channel().queue_declare(queue, durable=True, arguments=KEYED)


def rescale(gateway: GatewayServer, queue: str, body: dict[str, Any]) -> dict[str, Any]:
    status, answer = gateway.admin("POST", f"/api/queues/%2F/{queue}/rescale",
                                   {**body, "wait": True, "timeout": 120})  # fmt: skip
    assert status == 200 and answer["complete"] is True, (status, answer)
    return dict(answer["route"])


def open_partitions(route: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in route["partitions"] if p["range"]]


def run(
    cluster: TwoGroups, keys: int, per_key: int, kill_mid_split: bool = False
) -> tuple[Arrivals, list[dict[str, Any]]]:
    gw_a, gw_b = cluster.gateways
    queue = "orders"
    declare(gw_a, queue)
    versions: list[dict[str, Any]] = []
    started = threading.Event()
    errors: list[BaseException] = []

    def timed(gateway: GatewayServer, what: str, body: dict[str, Any]) -> None:
        began = time.monotonic()
        versions.append(rescale(gateway, queue, body))
        print(f"cluster rescale {what} under load: complete at version "
              f"{versions[-1]['version']} in {time.monotonic() - began:.2f} s")  # fmt: skip

    def operator() -> None:
        started.wait(30)
        time.sleep(0.5)
        timed(gw_a, "1 -> 4 partitions", {"partitions": 4})
        timed(gw_b, "4 -> 8 partitions", {"partitions": 8})
        first = open_partitions(versions[-1])[0]
        other = "g2" if first["group"] == "g1" else "g1"
        timed(gw_a, f"move of partition {first['partition']} to {other}",
              {"move": first["partition"], "to": other})  # fmt: skip
        if kill_mid_split:
            split_and_kill(gw_a, gw_b, queue, versions)
        timed(gw_b, "down to 2 partitions", {"partitions": 2})

    pika_on = gw_b if kill_mid_split else gw_a  # a publisher on a killed gateway loses its own
    publishers: list[Callable[[], None]] = [
        lambda: publish_pika(pika_on.url, queue, "pika", keys, per_key),
        lambda: publish_kombu(gw_b.url, queue, "kombu", keys, per_key),
    ]

    async def scenario() -> Arrivals:
        arrivals = Arrivals()
        stop = asyncio.Event()
        consumers = [
            asyncio.create_task(consumer(gateway.url, queue, f"{name}{i}", arrivals, stop,
                                         requeue_every=97 if i == 0 else 0))
            for gateway, name in ((gw_a, "a"), (gw_b, "b")) for i in range(2)
        ]  # fmt: skip
        threads = [threading.Thread(target=noting(errors, p)) for p in publishers]
        threads.append(threading.Thread(target=noting(errors, operator)))
        for thread in threads:
            thread.start()
        started.set()
        await publish_aio(gw_b.url, queue, "aio", keys, per_key)
        while any(t.is_alive() for t in threads):
            await asyncio.sleep(0.05)
        if kill_mid_split:  # it joins on the newest version (a child of this thread: see
            gw_a.start()  # bench.servers.die_with_parent)
        await arrivals.wait_for(3 * keys * per_key, 120)
        await asyncio.to_thread(show_state)  # while the consumers are still there
        stop.set()
        await asyncio.gather(*consumers, return_exceptions=kill_mid_split)
        return arrivals

    def show_state() -> None:
        """What a failure needs to be understood: each gateway's view of the route, and the
        brokers' ends."""
        for gateway in cluster.gateways:
            print(f"--- {gateway.data_dir.name}")
            _status, route = gateway.admin("GET", f"/api/queues/%2F/{queue}/route")
            for part in route.get("partitions", []):
                print({k: part.get(k) for k in SHOWN})
        for group in cluster.brokers:
            print(group, broker_ends(cluster, group))

    try:
        arrivals = asyncio.run(scenario())
    finally:
        for gateway in cluster.gateways:  # what a failure needs to be understood
            print(f"--- {gateway.data_dir.name}:\n" + "".join(gateway.log_lines[-60:]))
    assert not errors, errors
    every = [k for tag in ("pika", "kombu", "aio") for k in keys_of(tag, keys)]
    arrivals.check(every, per_key, gateway_killed=kill_mid_split)
    return arrivals, versions


def split_and_kill(
    gw_a: GatewayServer, gw_b: GatewayServer, queue: str, versions: list[dict[str, Any]]
) -> None:
    """gwA is asked for a split and killed -9 a moment later (before, during or after the
    change: wherever it lands, the change completes or never began): gwB carries a begun
    change through, and gwA, started again, joins on the newest version."""
    before = versions[-1]["version"]
    first = open_partitions(versions[-1])[0]["partition"]
    asked = threading.Thread(
        target=gw_a.admin, args=("POST", f"/api/queues/%2F/{queue}/rescale", {"split": first})
    )
    asked.start()
    time.sleep(0.02)
    gw_a.stop(signal.SIGKILL)  # started again by the main thread (run), which it dies with
    asked.join()
    began = time.monotonic()
    route: dict[str, Any] = {}
    while time.monotonic() - began < 60:
        status, route = gw_b.admin("GET", f"/api/queues/%2F/{queue}/route")
        if status == 200 and route["in_progress"] is None and route["target_partitions"] is None:
            break
        time.sleep(0.1)
    assert route.get("in_progress") is None, route
    print(f"cluster rescale: after a kill -9 of the gateway splitting, version "
          f"{route['version']} (was {before}) settled on the other in "
          f"{time.monotonic() - began:.2f} s")  # fmt: skip


def settled_counts(gateway: GatewayServer) -> bool:
    status, stats = gateway.admin("GET", "/api/queues/%2F/orders")
    assert status == 200
    return stats["messages_ready"] == 0 and stats["messages_unacknowledged"] == 0


def check_end(cluster: TwoGroups, versions: list[dict[str, Any]]) -> None:
    assert [len(open_partitions(v)) for v in versions][:3] == [4, 8, 8]
    if len(versions) == 5:  # the split on the killed gateway: done, or never begun
        assert len(open_partitions(versions[3])) in (8, 9)
    assert len(open_partitions(versions[-1])) == 2
    moved = versions[2]
    assert {p["group"] for p in open_partitions(moved)} == {"g1", "g2"}
    final = versions[-1]
    assert final["in_progress"] is None
    assert all(p["state"] in ("open", "removed") for p in final["partitions"])
    placed = cluster.route("orders")
    assert placed is not None and len(placed) == len(final["partitions"])
    for gateway in cluster.gateways:  # the holder's last commits reach the broker soon after
        check_for(10, lambda g=gateway: settled_counts(g), what=f"{gateway.data_dir.name} at 0")


def test_per_key_order_while_a_cluster_rescales_the_queue(two_groups: TwoGroups) -> None:
    arrivals, versions = run(two_groups, keys=40, per_key=40)
    check_end(two_groups, versions)
    by = {name for name, _, _ in arrivals.seen}
    assert by & {"a0", "a1"} and by & {"b0", "b1"}  # both gateways delivered


@pytest.mark.slow
def test_200k_messages_while_a_cluster_rescales_the_queue(two_groups: TwoGroups) -> None:
    _arrivals, versions = run(two_groups, keys=1000, per_key=67)
    check_end(two_groups, versions)


@pytest.mark.slow
def test_a_gateway_killed_in_the_middle_of_a_split(two_groups: TwoGroups) -> None:
    _arrivals, versions = run(two_groups, keys=200, per_key=100, kill_mid_split=True)
    check_end(two_groups, versions)
