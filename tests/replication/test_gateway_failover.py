"""A master killed under a publisher's confirm load: the gateway follows the new master,
re-sends what was not confirmed, and keeps the AMQP connection; nothing confirmed is lost."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pika
import pytest

from localcluster.nemesis.masters import overlaps, windows
from tests.harness.tcp_proxy import TcpProxy
from tests.replication.conftest import Group
from tests.replication.load import Publisher, drain, finish, loaded_group, more

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


def _confirmed_in_turn(group: Group) -> None:
    """Both brokers confirmed, never at one moment (their logs' stretches of confirms)."""
    found = [
        window
        for broker_id, broker in group.brokers.items()
        for window in windows(broker.log().splitlines(), broker_id)
    ]
    assert {window.host for window in found} == set(group.brokers)
    assert overlaps(sorted(found, key=lambda window: window.start)) == []


async def test_master_kill_loses_no_confirmed_message(group: Group) -> None:
    group.add_controller("c1")
    group.add_broker("a")
    group.add_broker("b")
    record = await group.until(lambda r: r.master != "" and len(r.in_sync) == 2)
    gateway = group.add_gateway("gw1")
    url = gateway.url
    connection = pika.BlockingConnection(pika.URLParameters(url))
    connection.channel().queue_declare("orders", durable=True)
    connection.close()
    publisher = Publisher(url, "orders")
    publisher.start()
    while len(publisher.confirmed) < 300 and publisher.error is None:
        time.sleep(0.02)
    killed = record.master
    group.master(record).kill()
    before_kill = len(publisher.confirmed)
    await group.until(lambda r: r.master not in ("", killed), timeout_s=10)
    deadline = time.monotonic() + 10
    while len(publisher.confirmed) < before_kill + 300 and time.monotonic() < deadline:
        time.sleep(0.02)
    publisher.stop.set()
    publisher.join(10)
    assert publisher.error is None, f"{publisher.error!r}\n{gateway.log()[-6000:]}"
    assert len(publisher.confirmed) >= before_kill + 300, "publishing did not resume"
    confirmed = set(publisher.confirmed)
    seen = drain(url, "orders", confirmed)
    missing = confirmed - set(seen)
    assert not missing, f"{len(missing)} confirmed message(s) lost, e.g. {sorted(missing)[:5]}"
    print(f"longest confirm stall at master kill: {publisher.longest_stall_s:.2f} s")
    assert publisher.longest_stall_s < 5


async def test_planned_switchover_under_load_has_no_publisher_error(group: Group) -> None:
    publisher, url = await loaded_group(group)
    record = await group.record()
    switched = subprocess.run(
        [sys.executable, "-m", "mqgw_cli.main", "ctl", "switchover", "g1",
         "--meta", group.redis.url],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert switched.returncode == 0, switched.stderr
    after = await group.record()
    assert after.master != record.master and after.epoch > record.epoch
    took = float(switched.stdout.rsplit(" in ", 1)[1].split()[0])
    more(publisher, 200)
    finish(publisher, url)
    _confirmed_in_turn(group)
    print(f"switchover took {took:.2f} s; longest confirm wait {publisher.longest_stall_s:.2f} s")
    assert took < 1.0


async def test_old_master_returns_rejoins_and_can_lead_again(group: Group) -> None:
    publisher, url = await loaded_group(group)
    first = await group.record()

    more(publisher, 200)
    old = group.master(first)
    old.kill()  # mid-stream: its log may hold an unconfirmed tail the new master lacks
    second = await group.until(lambda r: r.epoch > first.epoch and r.master != first.master)
    more(publisher, 200)
    old.start()  # back: resigns from its epoch, cuts back to the common point, follows
    await group.until(lambda r: r.in_sync == {"a", "b"} and r.epoch == second.epoch)
    assert f"broker {first.master} follows {second.master}" in old.log()
    more(publisher, 200)
    group.master(second).kill()
    await group.until(lambda r: r.master == first.master and r.epoch > second.epoch)
    more(publisher, 200)
    finish(publisher, url)


async def test_master_cut_off_from_redis_stops_confirming_before_another_is_elected(
    group: Group,
) -> None:
    proxies = {i: TcpProxy(group.redis.port) for i in ("a", "b")}
    try:
        group.add_controller("c1")
        for broker_id, proxy in proxies.items():
            group.add_broker(broker_id, meta=proxy.url())
        first = await group.until(lambda r: r.master != "" and len(r.in_sync) == 2)
        gateway = group.add_gateway("gw1")
        connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
        connection.channel().queue_declare("orders", durable=True)
        connection.close()
        publisher = Publisher(gateway.url, "orders")
        publisher.start()
        while len(publisher.confirmed) < 200 and publisher.error is None:
            time.sleep(0.02)
        proxies[first.master].cut()  # the gateway still reaches it; the controller does not
        second = await group.until(lambda r: r.epoch > first.epoch, timeout_s=10)
        count = len(publisher.confirmed)
        while len(publisher.confirmed) < count + 200 and publisher.error is None:
            time.sleep(0.02)
        proxies[first.master].heal()
        await group.until(lambda r: r.in_sync == {"a", "b"})
        publisher.stop.set()
        publisher.join(10)
        assert publisher.error is None, repr(publisher.error)
        old_log = group.brokers[first.master].log()
        ran_out = re.search(r"standing as master ran out at \S+ (\d\d:\d\d:\d\d,\d+)", old_log)
        assert ran_out is not None, old_log[-3000:]
        elected = re.search(
            rf"(\d\d:\d\d:\d\d,\d+) INFO mqgw.controller: group g1: {second.master} elected",
            group.controllers[0].log(),
        )
        assert elected is not None
        assert ran_out.group(1) < elected.group(1), (ran_out.group(1), elected.group(1))
        seen = drain(gateway.url, "orders", set(publisher.confirmed))
        assert set(publisher.confirmed) <= set(seen)
        _confirmed_in_turn(group)
    finally:
        for proxy in proxies.values():
            proxy.close()
