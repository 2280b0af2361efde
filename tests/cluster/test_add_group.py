"""A broker group added to a running cluster (`mqgw cluster add-group`) is used by the gateways
without a restart: new queues are placed on it, and publishing on one gateway and consuming
on the other works for them; a group whose broker is down gets no new queues, and its queues
work again when it returns.

Real processes through the real CLI (tests/cluster/test_cluster_cli.py's helpers tear them
down), pika as the client, the route table read from Redis.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import pika
import redis

from bench.servers import check_for
from meta.redis_keys import RedisKeys
from storage import connect_remote_store
from tests.cluster.test_cluster_cli import cli, cluster_dir, remember, state

Channel = pika.adapters.blocking_connection.BlockingChannel
PER_QUEUE = 50


def route(data: dict[str, Any], queue: str) -> list[str] | None:
    client = redis.Redis.from_url(data["meta_url"], decode_responses=True)
    try:
        text = client.get(RedisKeys().route("/", queue))
    finally:
        client.close()
    return None if text is None else list(json.loads(text))


def gateway(data: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(g for g in data["gateways"] if g["name"] == name)
    return found


def broker(data: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(b for b in data["brokers"] if b["name"] == name)
    return found


def log_has(directory: Path, name: str, text: str) -> bool:
    return text in (directory / "logs" / f"{name}.log").read_text(errors="replace")


def broker_queue_count(address: str) -> int:
    async def ask() -> int:
        async with connect_remote_store(address) as store:
            return len(await store.queues())

    return anyio.run(ask)


def open_channel(amqp_url: str) -> tuple[pika.BlockingConnection, Channel]:
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    return connection, connection.channel()


def drain(channel: Channel, queue: str, expected: int) -> list[bytes]:
    """Consume (manual acks) until ``expected`` messages came or 15 s pass without one."""
    got: list[bytes] = []
    for method, _properties, body in channel.consume(queue, inactivity_timeout=15):
        if method is None:
            break
        got.append(body)
        channel.basic_ack(method.delivery_tag)
        if len(got) == expected:
            break
    channel.cancel()
    return got


def test_a_group_added_while_running_takes_new_queues(tmp_path: Path) -> None:
    with cluster_dir(tmp_path) as (directory, seen):
        up = cli("up", "--dir", str(directory), "--gateways", "2", "--timeout", "60")
        assert up.returncode == 0, up.stderr
        data = remember(directory, seen)
        gw_a, gw_b = gateway(data, "gw1"), gateway(data, "gw2")
        conn_a, chan_a = open_channel(gw_a["amqp_url"])
        chan_a.queue_declare("before", durable=True)
        chan_a.confirm_delivery()
        chan_a.basic_publish("", "before", b"old", mandatory=True)
        assert route(data, "before") == ["g1"]

        added = cli("add-group", "--dir", str(directory), "--timeout", "60")
        assert added.returncode == 0, added.stderr
        assert "broker-g2-0" in added.stdout and "ready in" in added.stdout, added.stdout
        returned_at = time.monotonic()
        data = remember(directory, seen)
        new_broker = broker(data, "broker-g2-0")
        assert new_broker["group"] == "g2" and new_broker["alive"] and new_broker["pid"]
        # Both gateways pick it up from Redis within about a second.
        for name in ("gw1", "gw2"):
            check_for(5, lambda n=name: log_has(directory, n, "broker group g2 added"))
        noticed_s = time.monotonic() - returned_at
        assert noticed_s < 3, f"the gateways took {noticed_s:.1f} s to notice g2"

        # New queues declared on A spread over both groups (g2 holds fewer partitions).
        queues = [f"new-{n}" for n in range(6)]
        for queue in queues:
            chan_a.queue_declare(queue, durable=True)
        routes = {queue: route(data, queue) for queue in queues}
        on_g2 = [q for q, r in routes.items() if r == ["g2"]]
        assert len(on_g2) >= len(queues) // 2, routes
        assert set(map(tuple, filter(None, routes.values()))) <= {("g1",), ("g2",)}, routes
        assert route(data, "before") == ["g1"]  # existing queues stay where they were
        assert broker_queue_count(new_broker["address"]) >= len(on_g2)

        # Publish with confirms through B (which did not declare them), consume through A.
        conn_b, chan_b = open_channel(gw_b["amqp_url"])
        chan_b.confirm_delivery()
        for queue in queues:
            for n in range(PER_QUEUE):
                chan_b.basic_publish("", queue, f"{queue}:{n}".encode(), mandatory=True)
        for queue in queues:
            got = drain(chan_a, queue, PER_QUEUE)
            assert sorted(got) == sorted(f"{queue}:{n}".encode() for n in range(PER_QUEUE))
        assert drain(chan_b, "before", 1) == [b"old"]
        conn_a.close()
        conn_b.close()
        assert state(directory)["brokers"][-1]["name"] == "broker-g2-0"


def test_new_queues_avoid_a_group_whose_broker_is_down(tmp_path: Path) -> None:
    with cluster_dir(tmp_path) as (directory, seen):
        up = cli("up", "--dir", str(directory), "--groups", "2", "--timeout", "60")
        assert up.returncode == 0, up.stderr
        data = remember(directory, seen)
        # A replicated group needs a controller to elect its master: this cluster has none.
        refused = cli("add-group", "--dir", str(directory), "--replicas", "2")
        assert refused.returncode == 1 and "needs a running controller" in refused.stderr
        assert cli("add-group", "--dir", str(directory), "--replicas", "0").returncode == 2
        assert [b["name"] for b in state(directory)["brokers"]] == ["broker-g1-0", "broker-g2-0"]
        connection, channel = open_channel(gateway(data, "gw1")["amqp_url"])
        channel.confirm_delivery()
        for queue in ("first", "second"):
            channel.queue_declare(queue, durable=True)
        on_g2 = next(q for q in ("first", "second") if route(data, q) == ["g2"])
        channel.basic_publish("", on_g2, b"kept", mandatory=True)
        connection.close()

        stopped = cli("stop", "--dir", str(directory), "broker-g2-0", "--kill")
        assert stopped.returncode == 0, stopped.stderr
        check_for(10, lambda: log_has(directory, "gw1", "lost broker"))
        connection, channel = open_channel(gateway(data, "gw1")["amqp_url"])
        while_down = [f"down-{n}" for n in range(4)]
        for queue in while_down:
            channel.queue_declare(queue, durable=True)
        assert {q: route(data, q) for q in while_down} == {q: ["g1"] for q in while_down}

        started = cli("start", "--dir", str(directory), "broker-g2-0", "--timeout", "60")
        assert started.returncode == 0, started.stderr
        # The group was never dropped from routing: its queue and message are back.
        assert drain(channel, on_g2, 1) == [b"kept"]
        # And new queues go to it again (it holds the fewest partitions).
        names = iter(f"back-{n}" for n in range(100))

        def placed_on_g2() -> bool:
            queue = next(names)
            channel.queue_declare(queue, durable=True)
            return route(data, queue) == ["g2"]

        check_for(5, placed_on_g2, interval_s=0.1)
        connection.close()
