"""Outages around a replicated group under a pika confirm load: a slave killed and back, Redis
restarted, the leading controller killed during a failover. Each time publishing goes on and
every confirmed message is consumed afterwards."""

from __future__ import annotations

import time

import pika
import pytest

from tests.replication.conftest import Group
from tests.replication.test_gateway_failover import Publisher, _drain

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


async def _loaded_group(group: Group, controllers: int = 1) -> tuple[Publisher, str]:
    for n in range(1, controllers + 1):
        group.add_controller(f"c{n}")
    group.add_broker("a")
    group.add_broker("b")
    await group.until(lambda r: r.master != "" and len(r.in_sync) == 2)
    gateway = group.add_gateway("gw1")
    connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
    connection.channel().queue_declare("orders", durable=True)
    connection.close()
    publisher = Publisher(gateway.url, "orders")
    publisher.start()
    _more(publisher, 200)
    return publisher, gateway.url


def _more(publisher: Publisher, count: int, timeout_s: float = 15) -> None:
    target = len(publisher.confirmed) + count
    deadline = time.monotonic() + timeout_s
    while len(publisher.confirmed) < target and time.monotonic() < deadline:
        assert publisher.error is None, repr(publisher.error)
        time.sleep(0.02)
    assert len(publisher.confirmed) >= target, "publishing stalled"


def _finish(publisher: Publisher, url: str) -> None:
    publisher.stop.set()
    publisher.join(10)
    assert publisher.error is None, repr(publisher.error)
    confirmed = set(publisher.confirmed)
    seen = _drain(url, "orders", confirmed)
    missing = confirmed - set(seen)
    assert not missing, f"{len(missing)} confirmed message(s) lost, e.g. {sorted(missing)[:5]}"


async def test_slave_killed_leaves_the_set_and_comes_back(group: Group) -> None:
    publisher, url = await _loaded_group(group)
    record = await group.record()
    slave_id = next(i for i in group.brokers if i != record.master)
    slave = group.brokers[slave_id]
    slave.kill()
    # Confirms wait for it until the controller takes it out of the in-sync set.
    await group.until(lambda r: r.in_sync == {record.master})
    _more(publisher, 200)
    slave.start()
    await group.until(lambda r: r.in_sync == {"a", "b"})
    _more(publisher, 200)
    _finish(publisher, url)


async def test_redis_restart_in_steady_state(group: Group) -> None:
    publisher, url = await _loaded_group(group)
    before = await group.record()
    group.redis.restart()
    _more(publisher, 300)
    after = await group.record()
    assert after.master == before.master, "a Redis restart alone must not fail the master over"
    _finish(publisher, url)


async def test_leader_controller_killed_during_a_failover(group: Group) -> None:
    publisher, url = await _loaded_group(group, controllers=2)
    record = await group.record()
    leader = next(c for c in group.controllers if c.leads())
    group.master(record).kill()
    leader.kill()
    await group.until(lambda r: r.epoch > record.epoch and r.master != record.master, 15)
    _more(publisher, 200)
    _finish(publisher, url)
