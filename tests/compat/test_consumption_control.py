"""Operators stop and start consumption over HTTP at every scope, against a real gateway with
pika and aio-pika consumers: no delivery starts after the stop returns, unacked deliveries stay
ackable, publishing goes on, and after start every message arrives once, in order."""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pika
import pytest

from bench.servers import free_port
from tests.harness.processes import GatewayProcess, check_for

QUIET_S = 1.0  # how long a stopped consumer is watched for deliveries that must not come


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    data = tmp_path_factory.mktemp("controls") / "data"
    process = GatewayProcess(data, ["--admin-port", str(free_port())]).start()
    yield process
    process.stop()


@pytest.fixture(autouse=True)
def no_controls_left(gateway: GatewayProcess) -> Iterator[None]:
    yield
    for control in gateway.admin("GET", "/api/controls")[1]:
        gateway.admin("DELETE", control_path(gateway, control))


def control_path(gateway: GatewayProcess, control: dict[str, Any]) -> str:
    quote = lambda text: urllib.parse.quote(text, safe="")  # noqa: E731
    scope, name = control["scope"], control["name"]
    if scope == "global":
        return "/api/controls/global"
    if scope == "queue":
        return f"/api/controls/queues/{quote(control['vhost'])}/{quote(name)}"
    return f"/api/controls/{scope}s/{quote(name)}"


def put_control(gateway: GatewayProcess, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, answer = gateway.admin("PUT", path, body)
    assert status == 200, answer
    return dict(answer)


def queue_stats(gateway: GatewayProcess, queue: str) -> dict[str, Any]:
    status, stats = gateway.admin("GET", f"/api/queues/%2F/{queue}")
    assert status == 200, stats
    return dict(stats)


def connection_named(gateway: GatewayProcess, client_name: str) -> str:
    def find() -> str | None:
        for connection in gateway.admin("GET", "/api/connections")[1]:
            if connection["client_properties"].get("connection_name") == client_name:
                return str(connection["name"])
        return None

    return check_for(5, find)


def scope_path(gateway: GatewayProcess, scope: str, queue: str, client_name: str) -> str:
    quote = lambda text: urllib.parse.quote(text, safe="")  # noqa: E731
    if scope == "global":
        return "/api/controls/global"
    if scope == "node":
        return f"/api/controls/nodes/{quote(gateway.admin('GET', '/api/health')[1]['node'])}"
    if scope == "client-name":
        return f"/api/controls/clients/{quote(client_name)}"
    if scope == "client-address":
        return "/api/controls/clients/127.0.0.1"
    if scope == "connection":
        return f"/api/controls/connections/{quote(connection_named(gateway, client_name))}"
    return f"/api/controls/queues/%2F/{quote(queue)}"


def pika_connection(gateway: GatewayProcess, client_name: str) -> pika.BlockingConnection:
    params = pika.URLParameters(gateway.url)
    params.client_properties = {"connection_name": client_name}
    return pika.BlockingConnection(params)


def publish(gateway: GatewayProcess, queue: str, numbers: range, size: int = 0) -> None:
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for n in numbers:
            ch.basic_publish("", queue, str(n).encode().ljust(size, b" "))


SCOPES = ["global", "node", "client-name", "client-address", "connection", "queue"]


@pytest.mark.parametrize("scope", SCOPES)
def test_stop_holds_deliveries_and_start_resumes_in_order(
    gateway: GatewayProcess, scope: str
) -> None:
    queue, client_name = f"stop-{scope}", f"app-{scope}"
    conn = pika_connection(gateway, client_name)
    ch = conn.channel()
    ch.queue_declare(queue)
    ch.basic_qos(prefetch_count=10)
    publish(gateway, queue, range(50))
    received: list[int] = []
    held: list[int] = []  # delivery tags left unacked across the stop
    # pika allows one consume generator per queue: the same arguments every time.
    for method, _props, body in ch.consume(queue, inactivity_timeout=QUIET_S):
        assert method is not None, "consumer starved before the stop"
        received.append(int(body))
        if len(received) <= 15:
            ch.basic_ack(method.delivery_tag)
        else:
            held.append(method.delivery_tag)
        if len(received) == 20:
            break

    path = scope_path(gateway, scope, queue, client_name)
    control = put_control(gateway, path, {"state": "stopped"})
    assert control["state"] == "stopped" and control["set_by"] == "guest"
    delivered_at_stop = queue_stats(gateway, queue)["mqgw"]["delivered"]

    publish(gateway, queue, range(50, 100))  # publishing is untouched by a stop
    for method, _props, body in ch.consume(queue, inactivity_timeout=QUIET_S):
        if method is None:
            break
        received.append(int(body))  # framed before the stop returned (at most the prefetch)
        held.append(method.delivery_tag)
    assert len(received) <= 20 + 10
    getter = conn.channel()
    assert getter.basic_get(queue) == (None, None, None)  # basic.get is stopped too
    for tag in held:
        ch.basic_ack(tag)  # acks still work while stopped
    check_for(5, lambda: queue_stats(gateway, queue)["messages_unacknowledged"] == 0)
    stats = queue_stats(gateway, queue)
    assert stats["mqgw"]["delivered"] == delivered_at_stop, "a delivery started after the stop"
    assert stats["messages"] == 100 - len(received)  # the stopped queue counts new publishes
    assert stats["state"] == ("stopped" if scope in ("global", "node", "queue") else "running")

    put_control(gateway, path, {"state": "running"})
    for method, _props, body in ch.consume(queue, inactivity_timeout=QUIET_S):
        assert method is not None, f"only {len(received)} of 100 arrived after start"
        received.append(int(body))
        ch.basic_ack(method.delivery_tag)
        if len(received) == 100:
            break
    assert received == list(range(100))  # none lost, none twice, in order
    conn.close()


def test_aio_pika_consumer_stopped_by_client_name_and_started(gateway: GatewayProcess) -> None:
    queue = "aio-stop"

    async def scenario() -> list[int]:
        conn = await aio_pika.connect(gateway.url, client_properties={"connection_name": "aio-app"})
        async with conn:
            channel = await conn.channel()
            await channel.set_qos(prefetch_count=5)
            declared = await channel.declare_queue(queue)
            got: list[int] = []
            arrived = asyncio.Event()

            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                got.append(int(message.body))
                await message.ack()
                arrived.set()

            put_control(gateway, "/api/controls/clients/aio-app", {"state": "stopped"})
            await declared.consume(on_message)
            await asyncio.to_thread(publish, gateway, queue, range(30))
            await asyncio.sleep(QUIET_S)  # watching for deliveries that must not come
            assert got == []
            assert queue_stats(gateway, queue)["messages_ready"] == 30
            put_control(gateway, "/api/controls/clients/aio-app", {"state": "running"})
            while len(got) < 30:
                arrived.clear()
                await asyncio.wait_for(arrived.wait(), 5)
            return got

    assert asyncio.run(asyncio.wait_for(scenario(), 30)) == list(range(30))


def test_the_narrowest_state_wins(gateway: GatewayProcess) -> None:
    """Global stop + a queue's own 'running': that queue flows, the others wait; a client stop
    + a connection's own 'running': that connection's consumers flow."""
    conn = pika_connection(gateway, "narrow-app")
    ch = conn.channel()
    for queue in ("narrow-open", "narrow-shut"):
        ch.queue_declare(queue)
    put_control(gateway, "/api/controls/global", {"state": "stopped"})
    put_control(gateway, "/api/controls/queues/%2F/narrow-open", {"state": "running"})
    for queue in ("narrow-open", "narrow-shut"):
        ch.basic_consume(queue, lambda *_: None, auto_ack=True)
        publish(gateway, queue, range(10))
    conn.process_data_events(0)
    check_for(5, lambda: queue_stats(gateway, "narrow-open")["mqgw"]["delivered"] == 10)
    # The push scheduler served both queues in those turns: the shut one is held, not late.
    assert queue_stats(gateway, "narrow-shut")["mqgw"]["delivered"] == 0
    assert queue_stats(gateway, "narrow-shut")["mqgw"]["control"]["state_set_at_scope"] == "global"

    put_control(gateway, "/api/controls/clients/narrow-app", {"state": "stopped"})
    assert gateway.admin("DELETE", "/api/controls/global")[0] == 204
    probe = pika_connection(gateway, "narrow-probe")
    probe_channel = probe.channel()
    probe_channel.queue_declare("narrow-probe")
    probe_channel.basic_consume("narrow-probe", lambda *_: None, auto_ack=True)
    publish(gateway, "narrow-probe", range(10))
    check_for(5, lambda: queue_stats(gateway, "narrow-probe")["mqgw"]["delivered"] == 10)
    assert queue_stats(gateway, "narrow-shut")["mqgw"]["delivered"] == 0  # the client stop holds
    name = urllib.parse.quote(connection_named(gateway, "narrow-app"), safe="")
    put_control(gateway, f"/api/controls/connections/{name}", {"state": "running"})
    conn.process_data_events(0)
    check_for(5, lambda: queue_stats(gateway, "narrow-shut")["mqgw"]["delivered"] == 10)
    probe.close()
    conn.close()


def test_controls_survive_a_restart(tmp_path: Path) -> None:
    gateway = GatewayProcess(tmp_path / "data", ["--admin-port", str(free_port())]).start()
    try:
        with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
            conn.channel().queue_declare("kept-stopped", durable=True)
        put_control(gateway, "/api/controls/queues/%2F/kept-stopped", {"state": "stopped"})
        put_control(gateway, "/api/controls/clients/batch-jobs", {"rate_msgs": 25})
        before = gateway.admin("GET", "/api/controls")[1]
        assert gateway.stop() == 0
        gateway.start()
        assert gateway.admin("GET", "/api/controls")[1] == before
        publish(gateway, "kept-stopped", range(5))
        with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
            ch = conn.channel()
            ch.basic_consume("kept-stopped", lambda *_: None, auto_ack=True)
            conn.process_data_events(QUIET_S)
            assert queue_stats(gateway, "kept-stopped")["mqgw"]["delivered"] == 0
            assert gateway.admin("DELETE", "/api/controls/queues/%2F/kept-stopped")[0] == 204
            conn.process_data_events(0)
            check_for(5, lambda: queue_stats(gateway, "kept-stopped")["mqgw"]["delivered"] == 5)
    finally:
        gateway.stop()


def test_a_connection_control_goes_with_its_connection(gateway: GatewayProcess) -> None:
    conn = pika_connection(gateway, "short-lived")
    name = urllib.parse.quote(connection_named(gateway, "short-lived"), safe="")
    put_control(gateway, f"/api/controls/connections/{name}", {"rate_msgs": 10})
    assert gateway.admin("GET", f"/api/controls/connections/{name}")[0] == 200
    conn.close()
    check_for(5, lambda: gateway.admin("GET", f"/api/controls/connections/{name}")[0] == 404)
