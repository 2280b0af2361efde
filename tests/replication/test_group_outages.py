"""Outages around a replicated group under a pika confirm load: a slave killed and back, Redis
restarted, the leading controller killed during a failover. Each time publishing goes on and
every confirmed message is consumed afterwards."""

from __future__ import annotations

import pytest

from tests.replication.conftest import Group
from tests.replication.load import finish, loaded_group, more

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


async def test_slave_killed_leaves_the_set_and_comes_back(group: Group) -> None:
    publisher, url = await loaded_group(group)
    record = await group.record()
    slave_id = next(i for i in group.brokers if i != record.master)
    slave = group.brokers[slave_id]
    slave.kill()
    # Confirms wait for it until the controller takes it out of the in-sync set.
    await group.until(lambda r: r.in_sync == {record.master})
    more(publisher, 200)
    slave.start()
    await group.until(lambda r: r.in_sync == {"a", "b"})
    more(publisher, 200)
    finish(publisher, url)


async def test_redis_restart_in_steady_state(group: Group) -> None:
    publisher, url = await loaded_group(group)
    before = await group.record()
    group.redis.restart()
    more(publisher, 300)
    after = await group.record()
    assert after.master == before.master, "a Redis restart alone must not fail the master over"
    finish(publisher, url)


async def test_leader_controller_killed_during_a_failover(group: Group) -> None:
    publisher, url = await loaded_group(group, controllers=2)
    record = await group.record()
    leader = next(c for c in group.controllers if c.leads())
    group.master(record).kill()
    leader.kill()
    await group.until(lambda r: r.epoch > record.epoch and r.master != record.master, 15)
    more(publisher, 200)
    finish(publisher, url)
