"""Gray release on the embedded node, with real clients: a queue's gray partitions carry the
messages of gray publishers and of header-marked messages, only gray consumers read them,
normal consumers read the rest, and every message arrives once (docs/gray.md)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import aio_pika
import kombu
import pika
import pytest

from bench.servers import free_port
from tests.harness.processes import GatewayProcess

QUEUE_ARGS = {"x-mqgw-partitions": 6, "x-mqgw-gray-partitions": 2}


@pytest.fixture
def gateway(tmp_path: Any) -> Iterator[GatewayProcess]:
    process = GatewayProcess(tmp_path / "data", ["--admin-port", str(free_port())]).start()
    yield process
    process.stop()


def publish(url: str, queue: str, tag: str, count: int, gray: bool = False,
            marked: frozenset[int] = frozenset()) -> None:  # fmt: skip
    """``count`` persistent, confirmed messages "<tag>:<n>" from one channel; a gray client if
    ``gray``; the messages numbered in ``marked`` carry the gray header."""
    params = pika.URLParameters(url)
    params.client_properties = {"connection_name": f"pub-{tag}", "mqgw-gray": gray}
    with pika.BlockingConnection(params) as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        for n in range(count):
            headers = {"x-gray": True} if n in marked else None
            channel.basic_publish(
                "", queue, f"{tag}:{n}".encode(),
                pika.BasicProperties(delivery_mode=2, headers=headers),
            )  # fmt: skip


async def consume(url: str, queue: str, name: str, want: int, gray: bool | None = None,
                  timeout_s: float = 20) -> list[str]:  # fmt: skip
    """Consume (and ack) until ``want`` messages came; what came, in order."""
    properties: dict[str, Any] = {"connection_name": name}
    if gray is not None:
        properties["mqgw-gray"] = gray
    conn = await aio_pika.connect(url, client_properties=properties)
    got: list[str] = []
    done = asyncio.Event()
    async with conn:
        channel = await conn.channel()
        await channel.set_qos(prefetch_count=20)
        q = await channel.get_queue(queue, ensure=False)

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            got.append(message.body.decode())
            await message.ack()
            if len(got) >= want:
                done.set()

        await q.consume(on_message)
        await asyncio.wait_for(done.wait(), timeout_s)
    return got


def declare(url: str, queue: str, arguments: dict[str, Any]) -> None:
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        conn.channel().queue_declare(queue, durable=True, arguments=arguments)


def depth(gateway: GatewayProcess, queue: str) -> int:
    status, stats = gateway.admin("GET", f"/api/queues/%2F/{queue}")
    assert status == 200, stats
    return int(stats["messages_ready"]) + int(stats["messages_unacknowledged"])


def test_the_canary_gets_exactly_the_gray_messages_and_the_fleet_the_rest(
    gateway: GatewayProcess,
) -> None:
    declare(gateway.url, "orders", QUEUE_ARGS)
    publish(gateway.url, "orders", "normal", 200, marked=frozenset(range(0, 200, 10)))
    publish(gateway.url, "orders", "gray", 100, gray=True)
    gray_expected = {f"gray:{n}" for n in range(100)} | {f"normal:{n}" for n in range(0, 200, 10)}
    normal_expected = {f"normal:{n}" for n in range(200)} - gray_expected

    # The fleet alone: it gets the normal messages only; the gray ones wait, counted.
    fleet = asyncio.run(consume(gateway.url, "orders", "fleet", len(normal_expected)))
    assert set(fleet) == normal_expected and len(fleet) == len(normal_expected)
    assert depth(gateway, "orders") == len(gray_expected)

    # The canary: exactly the gray ones, each publisher's in order.
    canary = asyncio.run(consume(gateway.url, "orders", "canary", len(gray_expected), gray=True))
    assert set(canary) == gray_expected and len(canary) == len(gray_expected)
    for tag in ("gray", "normal"):
        numbers = [int(m.split(":")[1]) for m in canary if m.startswith(tag)]
        assert numbers == sorted(numbers)
    assert depth(gateway, "orders") == 0


def test_a_gray_consumer_sees_nothing_normal_and_a_switched_off_one_sees_all(
    gateway: GatewayProcess,
) -> None:
    declare(gateway.url, "jobs", QUEUE_ARGS)
    publish(gateway.url, "jobs", "normal", 50)
    publish(gateway.url, "jobs", "gray", 30, gray=True)

    async def scenario() -> tuple[list[str], list[str]]:
        canary = await consume(gateway.url, "jobs", "canary", 30, gray=True)
        publish(gateway.url, "jobs", "late", 20, gray=True)
        publish(gateway.url, "jobs", "latenormal", 20)
        # Gray handling off (the seed's graySwitch): every partition, both colors.
        conn_props = {"connection_name": "ops", "mqgw-gray-switch": False}
        conn = await aio_pika.connect(gateway.url, client_properties=conn_props)
        got: list[str] = []
        async with conn:
            channel = await conn.channel()
            q = await channel.get_queue("jobs", ensure=False)
            while len(got) < 90:
                message = await q.get(fail=False, timeout=5)
                if message is None:
                    break
                got.append(message.body.decode())
                await message.ack()
        return canary, got

    canary, everything = asyncio.run(scenario())
    assert set(canary) == {f"gray:{n}" for n in range(30)}
    assert sorted(everything) == sorted(
        [f"normal:{n}" for n in range(50)]
        + [f"late:{n}" for n in range(20)]
        + [f"latenormal:{n}" for n in range(20)]
    )


def test_gray_partitions_show_per_partition_in_the_queue_api(gateway: GatewayProcess) -> None:
    declare(gateway.url, "shown", QUEUE_ARGS)
    publish(gateway.url, "shown", "gray", 7, gray=True)
    status, stats = gateway.admin("GET", "/api/queues/%2F/shown")
    assert status == 200
    parts = stats["mqgw"]["partition_details"]
    assert [p["gray"] for p in parts] == [True, False, False, False, False, True]
    assert sum(p["depth"] for p in parts if p["gray"]) == 7
    assert sum(p["depth"] for p in parts) == 7
    assert stats["gray_partitions"] == 2 and stats["partitions"] == 6

    async def with_a_canary() -> list[int]:
        conn = await aio_pika.connect(gateway.url, client_properties={"mqgw-gray": True})
        async with conn:
            channel = await conn.channel()
            await channel.set_qos(prefetch_count=1)
            q = await channel.get_queue("shown", ensure=False)
            taken = asyncio.Event()

            async def hold(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                taken.set()  # not acked: it stays in the depth

            await q.consume(hold)
            await asyncio.wait_for(taken.wait(), 10)
            _, stats = gateway.admin("GET", "/api/queues/%2F/shown")
            parts = stats["mqgw"]["partition_details"]
            assert sum(p["depth"] for p in parts) == 7  # one unacked, six ready
            return [p["consumers"] for p in parts]

    assert asyncio.run(with_a_canary()) == [1, 0, 0, 0, 0, 1]


def queue_consumers(gateway: GatewayProcess, queue: str) -> int:
    status, stats = gateway.admin("GET", f"/api/queues/%2F/{queue}")
    assert status == 200, stats
    return int(stats["consumers"])


def gray_state(gateway: GatewayProcess, client_name: str) -> dict[str, Any]:
    status, connections = gateway.admin("GET", "/api/connections")
    assert status == 200, connections
    for c in connections:
        if c["client_properties"].get("connection_name") == client_name:
            return dict(c["mqgw"]["gray"])
    raise AssertionError(f"no connection {client_name!r}")


def test_a_rule_colors_live_connections_and_a_drained_switch_back_loses_nothing(
    gateway: GatewayProcess,
) -> None:
    """The canary is made gray by a rule while connected (within 1 s); a gray publisher's
    messages all reach it and never the fleet; the switch back with drain turns the
    publisher normal at once and moves the canary only after it took every gray message
    published before; everything arrives once."""
    declare(gateway.url, "billing", QUEUE_ARGS)

    async def scenario() -> tuple[list[str], list[str], float, float]:
        got: dict[str, list[str]] = {"canary": [], "fleet": []}
        conns = []
        for name in ("billing-canary-1", "fleet"):
            conn = await aio_pika.connect(gateway.url, client_properties={"connection_name": name})
            channel = await conn.channel()
            await channel.set_qos(prefetch_count=1 if name.startswith("billing") else 5)
            q = await channel.get_queue("billing", ensure=False)
            key = "canary" if name.startswith("billing") else "fleet"

            async def on_message(m: aio_pika.abc.AbstractIncomingMessage, key: str = key) -> None:
                got[key].append(m.body.decode())
                if key == "canary":
                    await asyncio.sleep(0.01)  # slow: gray messages still wait at the switch
                await m.ack()

            await q.consume(on_message)
            conns.append(conn)
        rule = {"match": {"connection_name": "*billing-canary*"}, "gray": True}
        assert gateway.admin("PUT", "/api/gray/rules/canary", rule)[0] == 201
        started = asyncio.get_running_loop().time()
        while gray_state(gateway, "billing-canary-1")["consumes"] != "gray":
            await asyncio.sleep(0.02)
        propagation = asyncio.get_running_loop().time() - started
        await asyncio.gather(
            asyncio.to_thread(publish, gateway.url, "billing", "billing-canary", 300),
            asyncio.to_thread(publish, gateway.url, "billing", "normal", 300),
        )
        back = {**rule, "gray": False, "drain": True}
        assert gateway.admin("PUT", "/api/gray/rules/canary", back)[0] == 204
        switch_started = asyncio.get_running_loop().time()
        # The canary's publisher, matched by the rule too: normal from now on.
        await asyncio.to_thread(publish, gateway.url, "billing", "billing-canary-after", 100)
        while gray_state(gateway, "billing-canary-1")["consumes"] != "normal":
            await asyncio.sleep(0.02)
        switch_back = asyncio.get_running_loop().time() - switch_started
        while len(got["canary"]) + len(got["fleet"]) < 700:
            await asyncio.sleep(0.02)
        # Marked messages now wait (no gray consumer is left) until gray release ends.
        marked = frozenset(range(20))
        await asyncio.to_thread(publish, gateway.url, "billing", "marked", 20, False, marked)
        while depth(gateway, "billing") < 20:
            await asyncio.sleep(0.02)
        assert gateway.admin("POST", "/api/gray/queues/%2F/billing/end")[0] == 202
        while len(got["canary"]) + len(got["fleet"]) < 720:
            await asyncio.sleep(0.02)
        _, ended = gateway.admin("GET", "/api/gray/queues/%2F/billing")
        assert ended["ended"] and ended["gray_now"] == []
        while ended["status"]["left"]:  # the last acks
            await asyncio.sleep(0.02)
            _, ended = gateway.admin("GET", "/api/gray/queues/%2F/billing")
        for conn in conns:
            await conn.close()
        return got["canary"], got["fleet"], propagation, switch_back

    canary, fleet, propagation, switch_back = asyncio.run(asyncio.wait_for(scenario(), 60))
    print(f"rule propagation {propagation * 1000:.0f} ms, switch back {switch_back:.2f} s")
    assert propagation < 1.0
    everything = canary + fleet
    assert len(everything) == len(set(everything)) == 720
    gray = {f"billing-canary:{n}" for n in range(300)}
    assert not gray & set(fleet), "a gray message reached a normal consumer"
    assert gray <= set(canary)
    # The canary moved only after the gray messages from before the switch were all taken.
    last_gray = max(canary.index(m) for m in gray)
    others = [i for i, m in enumerate(canary) if m not in gray]
    assert not others or min(others) > last_gray
    assert switch_back < 30
    assert any(m.startswith("billing-canary-after") for m in fleet)  # its publishes turned normal


def test_gray_partitions_from_a_policy_start_and_end_on_a_running_queue(
    gateway: GatewayProcess,
) -> None:
    declare(gateway.url, "payments", {"x-mqgw-partitions": 4})
    policy = {"pattern": "^payments$", "definition": {"gray-partitions": 2}, "apply-to": "queues"}
    assert gateway.admin("PUT", "/api/policies/%2F/gray", policy)[0] in (201, 204)
    publish(gateway.url, "payments", "gray", 40, gray=True)
    publish(gateway.url, "payments", "normal", 40)
    fleet = asyncio.run(consume(gateway.url, "payments", "fleet", 40))
    assert set(fleet) == {f"normal:{n}" for n in range(40)}
    assert depth(gateway, "payments") == 40  # the gray ones wait for a canary
    # Gray release ends with the policy: the fleet takes what the gray partitions hold.
    assert gateway.admin("DELETE", "/api/policies/%2F/gray")[0] == 204
    rest = asyncio.run(consume(gateway.url, "payments", "fleet", 40))
    assert sorted(rest) == sorted(f"gray:{n}" for n in range(40))


CANARY_SCRIPT = """
import asyncio, sys
import aio_pika

async def main():
    conn = await aio_pika.connect(sys.argv[1], client_properties={"mqgw-gray": True})
    channel = await conn.channel()
    await channel.set_qos(prefetch_count=10)
    queue = await channel.get_queue(sys.argv[2], ensure=False)
    async with queue.iterator() as messages:
        async for message in messages:  # never acked: the crash takes them all back
            print(message.body.decode(), flush=True)
            await asyncio.sleep(0.001)

asyncio.run(main())
"""


def test_a_mixed_fleet_and_a_crashing_canary_get_exactly_their_own(
    gateway: GatewayProcess, tmp_path: Any
) -> None:
    """pika, aio-pika and kombu consumers are the fleet; the canary (aio-pika) is killed
    (SIGKILL) while holding gray messages unacked, then restarts: the gray ones wait for it
    and come again flagged redelivered; no normal consumer ever sees a gray one."""
    declare(gateway.url, "mixed", QUEUE_ARGS)
    publish(gateway.url, "mixed", "g", 100, gray=True)
    gray = {f"g:{n}" for n in range(100)} | {f"n2:{n}" for n in range(0, 150, 15)}
    normal = {f"n1:{n}" for n in range(150)} | {f"n2:{n}" for n in range(150)} - gray

    # The canary's first life: it takes gray messages and dies holding them.
    crashed = subprocess.Popen(
        [sys.executable, "-c", CANARY_SCRIPT, gateway.url, "mixed"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert crashed.stdout is not None
    first_life = [crashed.stdout.readline().strip() for _ in range(10)]
    crashed.kill()
    crashed.wait()
    assert set(first_life) <= gray

    fleet: list[tuple[str, str]] = []  # (client, body)
    done = threading.Event()

    def pika_fleet() -> None:
        with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
            channel = conn.channel()
            channel.basic_qos(prefetch_count=10)
            for method, _, body in channel.consume("mixed", inactivity_timeout=0.2):
                if method is None:
                    if done.is_set():
                        break
                    continue
                fleet.append(("pika", body.decode()))
                channel.basic_ack(method.delivery_tag)

    def kombu_fleet() -> None:
        with kombu.Connection(gateway.url) as conn:
            queue = kombu.Queue("mixed", no_declare=True)

            def on_message(body: Any, message: Any) -> None:
                fleet.append(("kombu", message.body.decode()))
                message.ack()

            with conn.Consumer(queue, callbacks=[on_message], accept=None, prefetch_count=10):
                while not done.is_set():
                    with contextlib.suppress(TimeoutError):
                        conn.drain_events(timeout=0.2)

    threads = [threading.Thread(target=pika_fleet), threading.Thread(target=kombu_fleet)]
    for thread in threads:
        thread.start()

    async def aio_side() -> list[tuple[str, bool]]:
        aio_fleet = await aio_pika.connect(gateway.url, client_properties={"connection_name": "f"})
        channel = await aio_fleet.channel()
        await channel.set_qos(prefetch_count=10)
        q = await channel.get_queue("mixed", ensure=False)

        async def on_fleet(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            fleet.append(("aio-pika", message.body.decode()))
            await message.ack()

        await q.consume(on_fleet)
        canary: list[tuple[str, bool]] = []
        restarted = await aio_pika.connect(gateway.url, client_properties={"mqgw-gray": True})
        canary_channel = await restarted.channel()
        cq = await canary_channel.get_queue("mixed", ensure=False)

        async def on_canary(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            canary.append((message.body.decode(), message.redelivered))
            await message.ack()

        await cq.consume(on_canary)
        # Every fleet client is subscribed before the normal messages come: each gets some.
        while queue_consumers(gateway, "mixed") < 4:
            await asyncio.sleep(0.02)
        await asyncio.gather(
            asyncio.to_thread(publish, gateway.url, "mixed", "n1", 150),
            asyncio.to_thread(
                publish, gateway.url, "mixed", "n2", 150, False, frozenset(range(0, 150, 15))
            ),
        )
        deadline = asyncio.get_running_loop().time() + 30
        while len({b for _, b in fleet}) < len(normal) or len({b for b, _ in canary}) < len(gray):
            assert asyncio.get_running_loop().time() < deadline, "not every message came"
            await asyncio.sleep(0.02)
        await aio_fleet.close()
        await restarted.close()
        return canary

    try:
        canary = asyncio.run(aio_side())
    finally:
        done.set()
        for thread in threads:
            thread.join(10)
    assert {body for _, body in fleet} == normal and len(fleet) == len(normal)
    assert {client for client, _ in fleet} == {"pika", "kombu", "aio-pika"}
    assert {body for body, _ in canary} == gray and len(canary) == len(gray)
    assert all(redelivered for body, redelivered in canary if body in first_life)
