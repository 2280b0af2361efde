"""`mqgw controller` as real processes on a real redis-server.

Failing over a real master needs replication (not built yet): brokers here are stand-ins
that speak the heartbeat contract (tests/controller/fakes.py), and the tests check what the
controller decides and writes to Redis. A real `mqgw broker --meta` killed with -9 is marked
down from its registry lease.
"""

from __future__ import annotations

import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis.asyncio import Redis

from bench.servers import BrokerServer, free_port
from meta.groups.link import GroupLink
from meta.groups.timing import ControllerConfig
from tests.controller.fakes import ControllerProcess, FakeBroker, wait_for
from tests.harness.redis_server import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]
CONFIG = ControllerConfig()
S = frozenset


@dataclass
class Setup:
    root: Path
    redis: RedisServer
    link: GroupLink

    def controller(self, name: str) -> ControllerProcess:
        return ControllerProcess(name, self.redis.url, self.root / f"{name}.log").start()


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    with RedisServer(tmp_path / "redis") as redis:
        client = Redis.from_url(redis.url, decode_responses=True, protocol=2)
        yield Setup(tmp_path, redis, GroupLink(client))
        await client.aclose()


async def test_one_leads_and_the_other_takes_over_after_kill_9(setup: Setup) -> None:
    first = setup.controller("c1")
    await wait_for("c1 leads", first.leads, 10)
    second = setup.controller("c2")
    try:
        await wait_for("c2 started", lambda: "controller c2 started" in second.log(), 10)
        time.sleep(1.0)
        assert not second.leads()
        first.kill()
        took = await wait_for("c2 leads", second.leads, 10)
        # The rest of the lease (<= 2 s), then c2's next look (100 ms), with slack for load.
        assert took <= CONFIG.lease_ms / 1000 + 1.0, took
    finally:
        first.kill()
        second.kill()


async def test_sigterm_gives_the_lease_up_at_once(setup: Setup) -> None:
    first = setup.controller("c1")
    await wait_for("c1 leads", first.leads, 10)
    second = setup.controller("c2")
    try:
        await wait_for("c2 started", lambda: "controller c2 started" in second.log(), 10)
        assert first.stop() == 0
        assert "controller c1 gave up the lease" in first.log()
        took = await wait_for("c2 leads", second.leads, 5)
        assert took < 1.0, took  # its next tick, not the lease time (2 s)
    finally:
        first.kill()
        second.kill()


async def test_failover_decision_written_to_redis(setup: Setup) -> None:
    """Master a silent: b (in sync) is elected at the next epoch within the election
    silence, the change is on the stream, and a's late heartbeat is told it is not master."""
    controller = setup.controller("c1")
    a = FakeBroker(setup.link, "g1", "a", end=12, caught_up=S("b")).start()
    b = FakeBroker(setup.link, "g1", "b", end=11).start()
    try:
        await wait_for("a master", lambda: a.role == "master", 10)
        await wait_for("b in sync", lambda: a.record is not None and "b" in a.record.in_sync, 5)
        first = await setup.link.record("g1")
        assert (first.epoch, first.master, first.in_sync) == (1, "a", S("ab"))
        await a.stop()
        last_beat = time.monotonic()
        await wait_for("b elected", lambda: b.role == "master", 10)
        took = time.monotonic() - last_beat
        # Silence 2 s after a's last heartbeat, a tick, b's next beat: ~2.2 s; the goal: < 3 s.
        assert took < 3.0, took
        record = await setup.link.record("g1")
        assert (record.epoch, record.master, record.in_sync) == (2, "b", S("b"))
        entries = [fields for _, fields in await setup.link.changes()]
        elections = [(e["master"], e["epoch"]) for e in entries if e["kind"] == "group.master"]
        assert elections == [("a", "1"), ("b", "2")]
        assert entries[-1]["previous"] == "a"
        assert "master a silent for" in entries[-1]["reason"]
        # The old master comes back: its heartbeat's answer demotes it.
        a.stopped = False
        await a.beat()
        assert (a.role, a.epoch) == ("slave", 2)
        log = controller.log()
        assert "group g1: b elected master at epoch 2 (master a silent for" in log
    finally:
        await a.stop()
        await b.stop()
        controller.kill()


async def test_planned_switchover_is_fast(setup: Setup) -> None:
    controller = setup.controller("c1")
    a = FakeBroker(setup.link, "g1", "a", caught_up=S("b")).start()
    b = FakeBroker(setup.link, "g1", "b", end=10).start()
    try:
        await wait_for("b in sync", lambda: a.record is not None and "b" in a.record.in_sync, 10)
        await setup.link.request_switchover("g1", "b")
        took = await wait_for("b master", lambda: b.role == "master", 5)
        assert took < 1.0, took
        # (A group.demote may follow, if the controller read a's report from before a saw
        # the election: a heartbeats again at once when its role changes, so it is a race.)
        kinds = [fields["kind"] for _, fields in await setup.link.changes()]
        kinds = [kind for kind in kinds if kind != "group.demote"]
        assert kinds == ["group.master", "group.in_sync", "group.fence", "group.master"]
        assert "switchover to b: a stops confirming" in controller.log()
    finally:
        await a.stop()
        await b.stop()
        controller.kill()


async def test_leader_killed_during_a_failover(setup: Setup) -> None:
    first = setup.controller("c1")
    a = FakeBroker(setup.link, "g1", "a", caught_up=S("b")).start()
    b = FakeBroker(setup.link, "g1", "b").start()
    second = setup.controller("c2")
    try:
        await wait_for("b in sync", lambda: a.record is not None and "b" in a.record.in_sync, 10)
        await a.stop()
        first.kill()
        stopped = time.monotonic()
        await wait_for("b master", lambda: b.role == "master", 10)
        # c2 takes the lease (<= 2 s) while a's silence (2 s) runs: both overlap.
        assert time.monotonic() - stopped < 3.5
        assert "group g1: b elected master at epoch 2" in second.log()
    finally:
        await a.stop()
        await b.stop()
        first.kill()
        second.kill()


async def test_a_killed_broker_is_marked_down(setup: Setup) -> None:
    broker = BrokerServer(
        setup.root / "b", free_port(), setup.root / "b.log", "g7", "1", meta=setup.redis.url
    ).start()
    controller = setup.controller("c1")
    try:
        await wait_for("registered", lambda: "registered in" in broker.log(), 10)
        time.sleep(1.0)
        assert (await setup.link.record("g7")).down == S()
        broker.kill()
        killed = time.monotonic()
        await wait_for("down", lambda: _down(setup, "g7"), 10)
        # The registry lease (5 s) lapses, then the controller's next tick writes it.
        assert time.monotonic() - killed < 6.0
        # Logged right after the record is written: the test may read the log in between.
        await wait_for("logged", lambda: "group g7: down {1}" in controller.log(), 2)
        # Registered only (no heartbeat record): never elected.
        assert (await setup.link.record("g7")).master == ""
    finally:
        broker.kill()
        controller.kill(signal.SIGKILL)


async def _down(setup: Setup, group: str) -> bool:
    return "1" in (await setup.link.record(group)).down
