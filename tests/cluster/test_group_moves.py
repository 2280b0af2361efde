"""Groups that come and go under a running cluster (docs/elastic-queues.md), through the real
CLI on `mqgw cluster up --gateways 2 --groups 2`: `add-group` then `rebalance` until every
group's share is within 20 % of even, `drain-group` then `remove-group`, while pika
publishers with confirms and consumers on both gateways run; every confirmed message
arrives, and every queue works on both gateways afterwards."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pika
import pytest

from bench.servers import admin_call, check_for
from tests.cluster.test_add_group import gateway, open_channel, route
from tests.cluster.test_cluster_cli import cli, cluster_dir, remember, state
from tests.harness.confirming_clients import AckingConsumer

QUEUES = [f"spread-{n}" for n in range(12)]  # one partition each: g1 and g2 hold 6


class Traffic(threading.Thread):
    """Publishes to every queue in turn with confirms on one gateway."""

    def __init__(self, amqp_url: str, tag: str) -> None:
        super().__init__(daemon=True)
        self.url, self.tag = amqp_url, tag
        self.confirmed: list[bytes] = []
        self.nacked = 0
        self.stop = threading.Event()
        self.latencies: list[tuple[float, float]] = []  # (when, publish-to-confirm s)

    def run(self) -> None:
        conn, channel = open_channel(self.url)
        channel.confirm_delivery()
        n = 0
        while not self.stop.is_set():
            for queue in QUEUES:
                body = f"{self.tag}:{queue}:{n}".encode()
                sent = time.monotonic()
                try:
                    channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
                    self.confirmed.append(body)
                    self.latencies.append((sent, time.monotonic() - sent))
                except pika.exceptions.NackError:
                    self.nacked += 1
            n += 1
            time.sleep(0.01)
        conn.close()


def p99_ms(traffic: list[Traffic], start: float, end: float) -> float:
    """Publishers' confirm latency p99 over publishes sent between ``start`` and ``end``."""
    taken = sorted(lat for t in traffic for at, lat in t.latencies if start <= at < end)
    return round(taken[int(len(taken) * 0.99)] * 1000, 2) if taken else 0.0


def admin(data: dict[str, Any], method: str, path: str) -> tuple[int, Any]:
    return admin_call(gateway(data, "gw1")["admin_url"], method, path, None, "guest", "guest",
                      timeout_s=60)  # fmt: skip


def groups_of(data: dict[str, Any]) -> dict[str, list[str]]:
    return {q: route(data, q) or [] for q in QUEUES}


@pytest.mark.slow  # 29-35 s: the default tier keeps within its 40 minutes
def test_add_rebalance_drain_and_remove_a_group_under_traffic(tmp_path: Path) -> None:
    with cluster_dir(tmp_path) as (directory, seen):
        up = cli("up", "--dir", str(directory), "--gateways", "2", "--groups", "2",
                 "--timeout", "60")  # fmt: skip
        assert up.returncode == 0, up.stderr
        data = remember(directory, seen)
        conn, channel = open_channel(gateway(data, "gw1")["amqp_url"])
        for queue in QUEUES:
            channel.queue_declare(queue, durable=True)
        conn.close()
        consumers = [AckingConsumer(gateway(data, g)["amqp_url"], QUEUES, prefetch=20)
                     for g in ("gw1", "gw2")]  # fmt: skip
        traffic = [Traffic(gateway(data, g)["amqp_url"], g) for g in ("gw1", "gw2")]
        for worker in (*consumers, *traffic):
            worker.start()
        check_for(10, lambda: all(len(t.confirmed) > 100 for t in traffic))

        added = cli("add-group", "--dir", str(directory), "--timeout", "60")
        assert added.returncode == 0, added.stderr
        data = remember(directory, seen)
        for name in ("gw1", "gw2"):
            check_for(5, lambda n=name: "broker group g3 added"
                      in (directory / "logs" / f"{n}.log").read_text())  # fmt: skip
        dry = cli("rebalance", "--dir", str(directory), "--dry-run")
        assert dry.returncode == 0, dry.stderr
        plan = json.loads(dry.stdout)
        assert any(m["target"] == "g3" for m in plan["moves"]), plan
        assert all("g3" not in groups for groups in groups_of(data).values())  # dry: no move

        started = time.monotonic()
        done = cli("rebalance", "--dir", str(directory), "--per-minute", "600", "--window", "3")
        took = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        job = json.loads(done.stdout)
        moving = started + took - job["seconds"]  # the moves, after the measuring window
        print(
            f"rebalance under traffic: {job['done']} partitions in {job['seconds']:.1f} s "
            f"({job['partitions_per_minute']} per minute; {took:.1f} s with the 3 s "
            f"measure); publishers' confirm p99 {p99_ms(traffic, moving - 10, started)} ms "
            f"before, {p99_ms(traffic, moving, started + took)} ms during the moves"
        )
        status, shares = admin(data, "GET", "/api/cluster/shares?window_s=3")
        assert status == 200
        assert shares["spread"] <= 0.2, shares  # every group within 20 % of even
        assert shares["partitions"]["g3"] >= 3, shares

        drained = cli("drain-group", "--dir", str(directory), "g3", "--per-minute", "600")
        assert drained.returncode == 0, drained.stderr
        status, shares = admin(data, "GET", "/api/cluster/shares?window_s=0")
        assert shares["partitions"].get("g3", 0) == 0, shares
        refused = cli("remove-group", "--dir", str(directory), "g1")
        assert refused.returncode == 1 and "still holds" in refused.stderr, refused.stderr
        removed = cli("remove-group", "--dir", str(directory), "g3")
        assert removed.returncode == 0, removed.stderr
        assert [b["group"] for b in state(directory)["brokers"]] == ["g1", "g2"]
        assert state(directory)["retired_groups"] == ["g3"]  # its name is not used again

        marks = [len(t.confirmed) for t in traffic]  # still flowing with g3 gone
        check_for(
            10, lambda: all(len(t.confirmed) > m + 100 for t, m in zip(traffic, marks, strict=True))
        )
        for worker in traffic:
            worker.stop.set()
            worker.join(10)
        confirmed = {b for t in traffic for b in t.confirmed}
        check_for(30, lambda: confirmed <= {b for c in consumers for b in c.bodies()})
        for worker in consumers:
            worker.stop.set()
            worker.join(10)
        assert sum(t.nacked for t in traffic) == 0
        status, shares = admin(data, "GET", "/api/cluster/shares?window_s=0")
        assert set(shares["groups"]) == {"g1", "g2"}, shares


@pytest.mark.slow
def test_the_gateway_draining_a_group_killed_mid_job(tmp_path: Path) -> None:
    """gw1 runs a drain of g2 and is killed -9 in the middle: gw2 takes the job over by
    itself (its record in Redis) and finishes it, nothing is lost, and g2 can be removed.
    While it runs, another job is refused on either gateway."""
    with cluster_dir(tmp_path) as (directory, seen):
        up = cli("up", "--dir", str(directory), "--gateways", "2", "--groups", "2",
                 "--timeout", "60")  # fmt: skip
        assert up.returncode == 0, up.stderr
        data = remember(directory, seen)
        conn, channel = open_channel(gateway(data, "gw2")["amqp_url"])
        for queue in QUEUES:
            channel.queue_declare(queue, durable=True)
        conn.close()
        consumer = AckingConsumer(gateway(data, "gw2")["amqp_url"], QUEUES, prefetch=20)
        traffic = Traffic(gateway(data, "gw2")["amqp_url"], "gw2")
        consumer.start()
        traffic.start()
        check_for(10, lambda: len(traffic.confirmed) > 100)
        status, _ = admin(data, "POST", "/api/cluster/groups/g2/drain")
        assert status == 202
        check_for(20, lambda: admin(data, "GET", "/api/cluster/moves")[1]["done"] >= 1)
        other = gateway(data, "gw2")["admin_url"]
        shown = moves_on(other)
        assert (shown["state"], shown["gateway"]) == ("running", "gw1")
        again = cli("drain-group", "--admin", other, "g2")
        assert again.returncode != 0 and "a move job is running" in again.stderr
        killed = cli("stop", "--dir", str(directory), "gw1", "--kill")
        assert killed.returncode == 0, killed.stderr
        killed_at = time.monotonic()
        check_for(60, lambda: moves_on(other)["state"] == "finished")
        print(f"drain taken over and finished {time.monotonic() - killed_at:.1f} s after the kill")
        job = moves_on(other)
        assert (job["gateway"], job["resumed_by"]) == ("gw2", ["gw2"])
        assert job["done"] >= job["planned"] - len(job["failed"]) and not job["failed"]
        assert all("g2" not in open_groups(r) for r in routes_on(other))
        removed = cli("remove-group", "--admin", other, "g2", "--dir", str(directory))
        assert removed.returncode == 2  # --admin and --dir do not go together
        removed = cli("remove-group", "--admin", other, "g2")
        assert removed.returncode == 0, removed.stderr
        traffic.stop.set()
        traffic.join(10)
        confirmed = set(traffic.confirmed)
        check_for(30, lambda: confirmed <= set(consumer.bodies()))
        consumer.stop.set()
        consumer.join(10)
        assert traffic.nacked == 0


def routes_on(admin_url: str) -> list[dict[str, Any]]:
    """Every queue's route as the gateway at ``admin_url`` has it (never scaled: none)."""
    found = []
    for queue in QUEUES:
        status, route = admin_call(admin_url, "GET", f"/api/queues/%2F/{queue}/route", None,
                                   "guest", "guest", timeout_s=30)  # fmt: skip
        if status == 200:
            found.append(route)
    return found


def moves_on(admin_url: str) -> dict[str, Any]:
    status, shown = admin_call(admin_url, "GET", "/api/cluster/moves", None, "guest", "guest",
                               timeout_s=30)  # fmt: skip
    assert status == 200, shown
    return dict(shown)


def open_groups(route: dict[str, Any]) -> set[str]:
    return {p["group"] for p in route["partitions"] if p["state"] != "removed"}
