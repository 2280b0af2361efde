"""Gray release on a cluster of two gateways (redis-server, a broker, `mqgw serve --meta`):
the canary consumes on one gateway while the fleet consumes the same queue on the other, each
delivering its own lane; a rule set through one gateway colors a connection on the other
within a second; a drained switch back completes on the canary's gateway while the other
gateway is killed (kill -9), and nothing is lost (docs/gray.md)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest

from bench.servers import GatewayServer
from tests.cli.commands import clean_env, mqgw
from tests.cluster.conftest import Cluster, running_cluster
from tests.compat.test_gray_release import QUEUE_ARGS, declare, gray_state, publish

Got = list[tuple[str, bool]]  # (body, redelivered)


@pytest.fixture
def pair(tmp_path: Any) -> Iterator[Cluster]:
    with running_cluster(tmp_path, ("gwA", "gwB")) as made:
        yield made


class Consumer:
    """An aio-pika consumer that records (body, redelivered) and acks each message."""

    def __init__(self, name: str, slow_s: float = 0.0) -> None:
        self.name = name
        self.slow_s = slow_s  # per message, one at a time
        self.got: Got = []
        self.conn: aio_pika.abc.AbstractConnection | None = None

    async def start(self, gateway: GatewayServer, queue: str) -> None:
        props = {"connection_name": self.name}
        self.conn = await aio_pika.connect(gateway.url, client_properties=props)
        channel = await self.conn.channel()
        await channel.set_qos(prefetch_count=1 if self.slow_s else 5)
        q = await channel.get_queue(queue, ensure=False)

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            self.got.append((message.body.decode(), message.redelivered))
            if self.slow_s:
                await asyncio.sleep(self.slow_s)
            await message.ack()

        await q.consume(on_message)

    async def stop(self) -> None:
        if self.conn is not None and not self.conn.is_closed:
            await self.conn.close()

    def bodies(self) -> set[str]:
        return {body for body, _ in self.got}


async def until(what: str, probe: Any, timeout_s: float = 30) -> float:
    started = time.monotonic()
    while not probe():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - started


def test_canary_and_fleet_on_different_gateways_each_get_their_own(pair: Cluster) -> None:
    gw_a, gw_b = pair.gateways
    declare(gw_a.url, "orders", QUEUE_ARGS)
    publish(gw_a.url, "orders", "gray", 100, gray=True)
    publish(gw_b.url, "orders", "normal", 200, marked=frozenset(range(0, 200, 20)))
    gray = {f"gray:{n}" for n in range(100)} | {f"normal:{n}" for n in range(0, 200, 20)}
    normal = {f"normal:{n}" for n in range(200)} - gray

    async def scenario() -> tuple[Consumer, Consumer]:
        fleet, canary = Consumer("fleet"), Consumer("billing-canary-1")
        await fleet.start(gw_a, "orders")
        rule = {"match": {"connection_name": "billing-canary-*"}, "gray": True}
        assert gw_a.admin("PUT", "/api/gray/rules/canary", rule)[0] == 201
        await canary.start(gw_b, "orders")  # gray from the start: the rule is on gwB too
        await until("every message", lambda: len(fleet.got) + len(canary.got) >= 300)
        await fleet.stop()
        await canary.stop()
        return fleet, canary

    fleet, canary = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert fleet.bodies() == normal and len(fleet.got) == len(normal)
    assert canary.bodies() == gray and len(canary.got) == len(gray)


def test_a_drained_switch_back_completes_while_the_other_gateway_is_killed(
    pair: Cluster,
) -> None:
    gw_a, gw_b = pair.gateways
    declare(gw_a.url, "billing", QUEUE_ARGS)

    async def scenario() -> tuple[Consumer, Consumer, Consumer, float]:
        fleet, canary = Consumer("fleet"), Consumer("billing-canary-1", slow_s=0.01)
        await fleet.start(gw_a, "billing")
        await canary.start(gw_b, "billing")
        rule = {"match": {"connection_name": "*billing-canary*"}, "gray": True}
        assert gw_a.admin("PUT", "/api/gray/rules/canary", rule)[0] == 201
        # Set through gwA, applied on gwB within a second (the change feed).
        propagation = await until(
            "the canary colored", lambda: gray_state(gw_b, "billing-canary-1")["consumes"] == "gray"
        )
        assert propagation < 1.0
        await asyncio.gather(
            asyncio.to_thread(publish, gw_b.url, "billing", "billing-canary", 300),
            asyncio.to_thread(publish, gw_a.url, "billing", "normal", 300),
        )
        back = {**rule, "gray": False, "drain": True}
        assert gw_a.admin("PUT", "/api/gray/rules/canary", back)[0] == 204
        await until(
            "the switch back pending on gwB",
            lambda: gray_state(gw_b, "billing-canary-1")["switching_back"],
        )
        gw_a.kill()  # kill -9 of the gateway the operator used, and the fleet's
        await until(
            "the canary switched back on gwB",
            lambda: gray_state(gw_b, "billing-canary-1")["consumes"] == "normal",
        )
        fleet_again = Consumer("fleet-again")
        await fleet_again.start(gw_b, "billing")
        await until(
            "every message",
            lambda: len(fleet.bodies() | canary.bodies() | fleet_again.bodies()) >= 600,
        )
        await canary.stop()
        await fleet_again.stop()
        return fleet, canary, fleet_again, propagation

    fleet, canary, again, propagation = asyncio.run(asyncio.wait_for(scenario(), 90))
    print(f"rule propagation across gateways {propagation * 1000:.0f} ms")
    everything = fleet.got + canary.got + again.got
    expected = {f"billing-canary:{n}" for n in range(300)} | {f"normal:{n}" for n in range(300)}
    assert {body for body, _ in everything} == expected
    seen: set[str] = set()
    for body, redelivered in everything:  # a second delivery only as a flagged redelivery
        assert body not in seen or redelivered, f"{body} delivered twice, not flagged"
        seen.add(body)
    gray = {f"billing-canary:{n}" for n in range(300)}
    assert not gray & fleet.bodies() and not gray & again.bodies(), "gray to a normal consumer"


def test_with_redis_lost_connections_keep_their_gray_state(pair: Cluster) -> None:
    """Redis killed while gray release runs: every connection keeps its color, the canary
    still gets exactly the gray messages and the fleet the rest; Redis back, a rule change
    applies again."""
    gw_a, gw_b = pair.gateways
    declare(gw_a.url, "ledger", QUEUE_ARGS)

    async def scenario() -> tuple[Consumer, Consumer]:
        fleet, canary = Consumer("fleet"), Consumer("ledger-canary")
        await fleet.start(gw_a, "ledger")
        await canary.start(gw_b, "ledger")
        rule = {"match": {"connection_name": "ledger-canary"}, "gray": True}
        assert gw_b.admin("PUT", "/api/gray/rules/canary", rule)[0] == 201
        await until("gray", lambda: gray_state(gw_b, "ledger-canary")["consumes"] == "gray")
        # The canary's gateway delivers the gray lane, the fleet's the normal one.
        publish(gw_b.url, "ledger", "warm-gray", 1, True)
        publish(gw_a.url, "ledger", "warm-normal", 1)
        await until("both lanes delivered", lambda: canary.got and fleet.got)
        pair.redis.stop()
        assert gray_state(gw_b, "ledger-canary")["consumes"] == "gray"
        await asyncio.gather(
            asyncio.to_thread(publish, gw_b.url, "ledger", "gray", 50, True),
            asyncio.to_thread(publish, gw_a.url, "ledger", "normal", 50),
        )
        await until("every message", lambda: len(fleet.got) + len(canary.got) >= 102)
        assert gray_state(gw_b, "ledger-canary")["consumes"] == "gray"
        pair.redis.start()
        # Redis back: a rule change reaches the canary's gateway again.
        assert gw_a.admin("DELETE", "/api/gray/rules/canary")[0] == 204
        await until(
            "the rule gone", lambda: gray_state(gw_b, "ledger-canary")["consumes"] == "normal"
        )
        await fleet.stop()
        await canary.stop()
        return fleet, canary

    fleet, canary = asyncio.run(asyncio.wait_for(scenario(), 90))
    assert canary.bodies() == {f"gray:{n}" for n in range(50)} | {"warm-gray:0"}
    assert fleet.bodies() == {f"normal:{n}" for n in range(50)} | {"warm-normal:0"}


def test_the_drain_command_waits_for_a_canary_on_another_gateway(pair: Cluster) -> None:
    """`mqgw ctl gray off RULE --drain` through gwA ends only once the canary, consuming on
    gwB, has switched back: the other gateways' switch backs count as pending."""
    gw_a, gw_b = pair.gateways
    declare(gw_a.url, "invoices", QUEUE_ARGS)

    async def scenario() -> tuple[subprocess.CompletedProcess[str], dict[str, Any], float]:
        canary = Consumer("invoices-canary", slow_s=0.01)
        await canary.start(gw_b, "invoices")
        rule = {"match": {"connection_name": "invoices-canary"}, "gray": True}
        assert gw_a.admin("PUT", "/api/gray/rules/canary", rule)[0] == 201
        await until("gray", lambda: gray_state(gw_b, "invoices-canary")["consumes"] == "gray")
        await asyncio.to_thread(publish, gw_a.url, "invoices", "gray", 200, True)
        env = clean_env(Path(pair.root), MQGW_ADMIN_URL=f"http://127.0.0.1:{gw_a.admin_port}")
        started = time.monotonic()
        done = await asyncio.to_thread(mqgw, "ctl", "gray", "off", "canary", "--drain", env=env)
        took = time.monotonic() - started
        state = gray_state(gw_b, "invoices-canary")
        await canary.stop()
        return done, state, took

    done, state, took = asyncio.run(asyncio.wait_for(scenario(), 90))
    print(f"gray off --drain across gateways: {took:.2f} s")
    assert done.returncode == 0, done.stderr
    assert "waiting" in done.stdout  # it did wait: 200 messages at 100 a second
    assert done.stdout.strip().splitlines()[-1].startswith("gray rule 'canary': gray off, drained")
    assert state["consumes"] == "normal" and not state["switching_back"]
    assert took < 30
