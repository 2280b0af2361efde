"""`mqgw cluster up --replicas 2 --controllers 2`, run as users run it: the real CLI, redis-server,
two controllers, a replicated broker group, a gateway, pika with confirms. The failover drill:
kill the master with the CLI, watch cluster.json follow (the watcher, not a command, writes
it), keep publishing, bring the old master back as a slave, kill the leading controller.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pika
import pytest
import redis

from tests.cluster.test_cluster_cli import (
    cli,
    cluster_dir,
    entries,
    remember,
    running,
    state,
    status,
)
from tests.harness.waiting import check_for

QUEUE = "orders"


def masters(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for b in data["brokers"] if b["role"] == "master"]


def leaders(data: dict[str, Any]) -> list[str]:
    return [c["name"] for c in data["controllers"] if c["leader"]]


def publish(channel: Any, numbers: range) -> None:
    """Persistent messages, each confirmed (pika's BlockingChannel raises on a nack)."""
    for n in numbers:
        channel.basic_publish(
            "", QUEUE, str(n).encode(), pika.BasicProperties(delivery_mode=2), mandatory=True
        )


def drain(channel: Any, expected: set[int], timeout_s: float = 20) -> set[int]:
    seen: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while not expected <= seen and time.monotonic() < deadline:
        method, _properties, body = channel.basic_get(QUEUE, auto_ack=True)
        if method is None:
            time.sleep(0.05)
            continue
        seen.add(int(body))
    return seen


def election_ms(url: str, epoch: int) -> int:
    """Redis time at which the controller elected a master at ``epoch``: the id of its
    ``group.master`` entry in the decisions stream."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        decisions: Any = client.xrevrange("mqgw:group-changes")  # [(id, fields)], newest first
        for entry_id, fields in decisions:
            if fields.get("kind") == "group.master" and int(fields["epoch"]) == epoch:
                return int(entry_id.split("-")[0])
    finally:
        client.close()
    raise AssertionError(f"no group.master entry at epoch {epoch}")


@pytest.mark.slow  # 30 s: the default tier keeps within its 40 minutes
def test_failover_drill_through_the_cli(tmp_path: Path) -> None:
    with cluster_dir(tmp_path) as (directory, seen):
        d = str(directory)
        started = cli("up", "--dir", d, "--replicas", "2", "--controllers", "2")
        assert started.returncode == 0, started.stdout + started.stderr
        assert "g1: broker-g1-" in started.stdout and "is master at epoch 1" in started.stdout
        data = remember(directory, seen)
        assert data["format"] == 2
        assert [c["name"] for c in data["controllers"]] == ["c1", "c2"]
        assert [b["name"] for b in data["brokers"]] == ["broker-g1-0", "broker-g1-1"]
        assert all(b["replication"] == "sync" for b in data["brokers"])
        assert data["watcher"]["name"] == "watcher"
        for entry in entries(data):
            assert running(entry), entry
        # up returns once the group has its master (gateways would not find it before).
        (master,) = masters(data)
        assert master["epoch"] == 1
        (leader,) = leaders(data)
        slave = next(b for b in data["brokers"] if b is not master)
        check_for(
            15,
            lambda: [(b["role"], b["in_sync"]) for b in state(directory)["brokers"]
                     if b["name"] == slave["name"]] == [("slave", True)],
            what="the other broker is a slave in sync",
        )  # fmt: skip
        check_for(15, lambda: status(directory)[0] == 0, what="status healthy")
        code, report = status(directory)
        assert report["leader"] == leader
        assert report["groups"] == [
            {"group": "g1", "epoch": 1, "master": master["name"], "fence": None,
             "in_sync": ["broker-g1-0", "broker-g1-1"]}
        ]  # fmt: skip
        table = cli("status", "--dir", d).stdout
        assert f"controller leader: {leader}" in table
        assert f"group g1: master {master['name']} at epoch 1" in table

        # A publisher with confirms on the gateway: its connection outlives the failover.
        connection = pika.BlockingConnection(pika.URLParameters(data["gateways"][0]["amqp_url"]))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(QUEUE, durable=True)
        publish(channel, range(50))

        # kill -9 the master: cluster.json (the watcher) names the new one at a higher epoch.
        killed = cli("stop", "--dir", d, "--kill", master["name"])
        assert killed.returncode == 0, killed.stdout + killed.stderr
        assert not running(master)
        after_kill = time.monotonic()
        check_for(
            4.5,
            lambda: (
                [(b["name"], b["epoch"]) for b in masters(state(directory))] == [(slave["name"], 2)]
            ),
            what="the slave is master at epoch 2 in cluster.json",
        )
        seen_at_ms = time.time() * 1000
        print(f"kill -> new master in cluster.json: {time.monotonic() - after_kill:.2f} s")
        lag_ms = seen_at_ms - election_ms(data["meta_url"], 2)
        print(f"election -> cluster.json: {lag_ms:.0f} ms")
        assert lag_ms < 1000, "cluster.json followed the failover more than a second late"
        old = next(b for b in state(directory)["brokers"] if b["name"] == master["name"])
        assert (old["pid"], old["alive"], old["role"]) == (None, False, "none")

        # Publishing goes on, on the same connection; nothing confirmed is lost.
        publish(channel, range(50, 100))
        assert drain(channel, set(range(100))) == set(range(100))

        # The old master comes back (same data, same port) and rejoins as a slave.
        back = cli("start", "--dir", d, master["name"])
        assert back.returncode == 0, back.stdout + back.stderr
        brokers = {b["name"]: b for b in remember(directory, seen)["brokers"]}
        returned = brokers[master["name"]]
        assert returned["port"] == master["port"] and returned["pid"] != master["pid"]
        check_for(
            15,
            lambda: [(b["role"], b["epoch"]) for b in state(directory)["brokers"]
                     if b["name"] == master["name"]] == [("slave", 2)],
            what="the old master is a slave at epoch 2",
        )  # fmt: skip
        publish(channel, range(100, 110))
        assert drain(channel, set(range(100, 110))) == set(range(100, 110))
        connection.close()

        # kill -9 the leading controller: the other takes the lease (after its 2 s).
        killed = cli("stop", "--dir", d, "--kill", leader)
        assert killed.returncode == 0, killed.stdout + killed.stderr
        other = "c2" if leader == "c1" else "c1"
        check_for(
            15, lambda: leaders(state(directory)) == [other], what="the other controller leads"
        )
        code, report = status(directory)
        assert report["leader"] == other and code == 1  # the killed one is not running
        (dead,) = [p for p in report["processes"] if p["name"] == leader]
        assert (dead["alive"], dead["leader"]) == (False, False)

        # down stops everything, the controllers and the watcher included.
        before = remember(directory, seen)
        down = cli("down", "--dir", d)
        assert down.returncode == 0, down.stdout + down.stderr
        for entry in entries(before):
            if entry["pid"]:
                assert not running(entry), entry
        after = state(directory)
        assert all(e["pid"] is None and e["alive"] is False for e in entries(after))
        assert leaders(after) == []
