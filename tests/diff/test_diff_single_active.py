"""Single active consumer (x-single-active-consumer) compared with RabbitMQ 3.10: one consumer
gets the messages, fail-over on cancel and on a killed connection (to the waiting consumer
with the highest x-priority, unacked messages first and redelivered), no pre-emption by a
later higher-priority consumer, exclusive consumers refused, counts, and the management API's
view (queue single_active_consumer_tag, consumers' active/activity_status), for which this
module starts its own RabbitMQ with the management plugin.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pamqp import commands as c

from bench.servers import admin_call
from tests.diff.raw import Message, RawClient, describe_close
from tests.diff.support import Server, run_both
from tests.harness.processes import GatewayProcess, check_for
from tests.harness.rabbitmq import RabbitMQProcess, free_port

SAC = {"x-single-active-consumer": True}


def _client(server: Server) -> RawClient:
    client = server.raw()
    client.connect()
    client.open_channel(1)
    return client


def _show(item: Any) -> Any:
    if isinstance(item, Message):
        method = dict(item.method)
        return (method.get("consumer_tag"), item.body, method["redelivered"])
    if isinstance(item, c.Channel.Close | c.Connection.Close):
        return describe_close(item)
    return item if isinstance(item, str) else (item.name, dict(item))


def _drain(client: RawClient, quiet_s: float = 0.4) -> list[Any]:
    return [_show(item) for item in client.drain(1, quiet_s)]


def _exclusive_refused(server: Server, p: str) -> Any:
    with server.raw() as a:
        a.open_channel(1)
        a.rpc(1, c.Queue.Declare(queue=f"{p}-q", arguments=SAC))
        alone = _show(a.rpc(1, c.Basic.Consume(queue=f"{p}-q", consumer_tag="x", exclusive=True)))
        a.open_channel(2)
        a.rpc(2, c.Basic.Consume(queue=f"{p}-q", consumer_tag="a"))
        a.open_channel(3)
        second = _show(a.rpc(3, c.Basic.Consume(queue=f"{p}-q", consumer_tag="x", exclusive=True)))
        return alone, second


def _failover_on_connection_loss(server: Server, p: str) -> Any:
    a, b, d = _client(server), _client(server), _client(server)
    a.rpc(1, c.Queue.Declare(queue=f"{p}-q", arguments=SAC))
    a.rpc(1, c.Basic.Qos(prefetch_count=2))
    subscribed = [
        _show(a.rpc(1, c.Basic.Consume(queue=f"{p}-q", consumer_tag="A"))),
        _show(b.rpc(1, c.Basic.Consume(queue=f"{p}-q", consumer_tag="B"))),
        _show(
            d.rpc(1, c.Basic.Consume(queue=f"{p}-q", consumer_tag="D", arguments={"x-priority": 5}))
        ),
    ]
    for i in range(5):
        b.publish(1, "", f"{p}-q", b"m%d" % i)
    first = [_drain(a), _drain(b), _drain(d)]
    counts = _show(b.rpc(1, c.Queue.Declare(queue=f"{p}-q", passive=True)))
    a.sock.close()  # killed: D (priority 5) takes over, A's two unacked first
    second = [_drain(b), _drain(d, 0.8)]
    d.close()
    third = _drain(b, 0.8)
    b.close()
    return subscribed, first, counts, second, third


def _cancel_hands_over(server: Server, p: str) -> Any:
    """After basic.cancel the old consumer keeps (and may ack) what it holds."""
    a, b = _client(server), _client(server)
    a.rpc(1, c.Queue.Declare(queue=f"{p}-q", arguments=SAC))
    a.rpc(1, c.Basic.Consume(queue=f"{p}-q", consumer_tag="A"))
    b.rpc(1, c.Basic.Consume(queue=f"{p}-q", consumer_tag="B"))
    for i in range(2):
        b.publish(1, "", f"{p}-q", b"m%d" % i)
    held = _drain(a)
    cancelled = _show(a.rpc(1, c.Basic.Cancel(consumer_tag="A")))
    b.publish(1, "", f"{p}-q", b"after")
    after = [_drain(a), _drain(b)]
    a.send(1, c.Basic.Ack(delivery_tag=0, multiple=True))
    counts = _show(a.rpc(1, c.Queue.Declare(queue=f"{p}-q", passive=True)))
    a.close()
    b.close()
    return held, cancelled, after, counts


def _no_preemption(server: Server, p: str) -> Any:
    """A later consumer with a higher x-priority waits; messages wait for a full active one;
    basic.get still works."""
    a, b = _client(server), _client(server)
    a.rpc(1, c.Queue.Declare(queue=f"{p}-q", arguments=SAC))
    a.rpc(1, c.Basic.Qos(prefetch_count=1))
    a.rpc(1, c.Basic.Consume(queue=f"{p}-q", consumer_tag="A"))
    b.rpc(1, c.Basic.Consume(queue=f"{p}-q", consumer_tag="B", arguments={"x-priority": 10}))
    for i in range(3):
        b.publish(1, "", f"{p}-q", b"m%d" % i)
    delivered = [_drain(a), _drain(b)]
    got = _show(b.rpc(1, c.Basic.Get(queue=f"{p}-q", no_ack=True)))
    counts = _show(b.rpc(1, c.Queue.Declare(queue=f"{p}-q", passive=True)))
    a.close()
    b.close()
    return delivered, got, counts


def _with_priorities(server: Server, p: str) -> Any:
    """x-single-active-consumer with x-max-priority: one consumer, priority order."""
    a, b = _client(server), _client(server)
    a.rpc(1, c.Queue.Declare(queue=f"{p}-q", arguments={**SAC, "x-max-priority": 5}))
    a.rpc(1, c.Basic.Qos(prefetch_count=1))
    a.rpc(1, c.Basic.Consume(queue=f"{p}-q", consumer_tag="A"))
    b.rpc(1, c.Basic.Consume(queue=f"{p}-q", consumer_tag="B"))
    b.publish(1, "", f"{p}-q", b"first")
    out = [_drain(a)]
    b.rpc(1, c.Confirm.Select())  # the three are in the queue before A acks (confirmed)
    for body, priority in [(b"low", 1), (b"high", 5), (b"mid", 3)]:
        b.publish(1, "", f"{p}-q", body, c.Basic.Properties(priority=priority))
        b.next_method(1)
    for tag in range(1, 4):
        a.send(1, c.Basic.Ack(delivery_tag=tag))
        out.append(_drain(a))
    out.append(_drain(b))
    a.close()
    b.close()
    return out


@pytest.mark.parametrize(
    "scenario",
    [_exclusive_refused, _failover_on_connection_loss, _cancel_hands_over, _no_preemption,
     _with_priorities],
)  # fmt: skip
def test_single_active_consumer_like_rabbitmq(
    servers: list[Server], names: str, scenario: Any
) -> None:
    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit


# -- the management API ----------------------------------------------------------------------


class ManagedRabbitMQ(RabbitMQProcess):
    """RabbitMQ with the management plugin, its statistics collected every 100 ms."""

    mgmt_port = 0

    def _env(self, epmd_port: int, dist_port: int) -> dict[str, str]:
        env = super()._env(epmd_port, dist_port)
        self.mgmt_port = free_port()
        (self.base_dir / "enabled_plugins").write_text("[rabbitmq_management].\n")
        config = self.base_dir / "rabbitmq.conf"
        config.write_text(
            config.read_text()
            + f"management.tcp.port = {self.mgmt_port}\nmanagement.tcp.ip = 127.0.0.1\n"
            + "collect_statistics_interval = 100\n"
        )
        return env

    def api(self, path: str) -> Any:
        base = f"http://127.0.0.1:{self.mgmt_port}"
        status, answer = admin_call(base, "GET", path, None, "guest", "guest", timeout_s=30)
        assert status == 200, answer
        return answer


@pytest.fixture(scope="module")
def managed_rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedRabbitMQ]:
    process = ManagedRabbitMQ(Path(tmp_path_factory.mktemp("rabbitmq-management")))
    process.start(timeout_s=120)
    yield process
    process.stop()


def _consumer_view(consumer: dict[str, Any]) -> dict[str, Any]:
    """A consumer without what differs by design (ports, node and connection names)."""
    channel = consumer["channel_details"]
    return {
        **{k: v for k, v in consumer.items() if k != "channel_details"},
        "channel_details": {
            "keys": sorted(channel),
            "number": channel["number"],
            "user": channel["user"],
            "named": channel["name"] == f"{channel['connection_name']} ({channel['number']})",
        },
    }


def test_management_view_like_rabbitmq(
    managed_rabbitmq: ManagedRabbitMQ, diff_gateway: GatewayProcess, names: str
) -> None:
    def gateway_api(path: str) -> Any:
        status, answer = diff_gateway.admin("GET", path)
        assert status == 200, answer
        return answer

    servers = [
        (Server("rabbitmq", managed_rabbitmq.amqp_port), managed_rabbitmq.api),
        (Server("gateway", diff_gateway.amqp_port), gateway_api),
    ]
    views = []
    for server, api in servers:
        p = names
        a, b = _client(server), _client(server)
        a.rpc(1, c.Queue.Declare(queue=f"{p}-sac", arguments=SAC))
        a.rpc(1, c.Queue.Declare(queue=f"{p}-plain"))
        a.rpc(1, c.Basic.Qos(prefetch_count=7))
        a.rpc(1, c.Basic.Consume(queue=f"{p}-sac", consumer_tag="A"))
        a.rpc(1, c.Basic.Consume(queue=f"{p}-plain", consumer_tag="E", exclusive=True, no_ack=True))
        b.rpc(1, c.Basic.Consume(queue=f"{p}-sac", consumer_tag="B", arguments={"x-priority": 3}))

        def queue(name: str, api: Any = api) -> Any:
            return api(f"/api/queues/%2F/{name}")

        def settled(tag: str, api: Any = api, p: str = p) -> Any:
            found = queue(f"{p}-sac")
            listed = [c for c in api("/api/consumers") if c["queue"]["name"].startswith(p)]
            ready = found.get("single_active_consumer_tag") == tag and len(listed) == 3
            return (found, listed) if ready else None

        view: list[Any] = []
        for tag in ("A", "B"):
            found, listed = check_for(20, lambda tag=tag: settled(tag), interval_s=0.1)
            listing = [q for q in api("/api/queues") if q["name"].startswith(p)]
            view.append(
                (
                    {k: found[k] for k in ("single_active_consumer_tag", "exclusive_consumer_tag")},
                    sorted(
                        (q["name"], q["single_active_consumer_tag"], q["exclusive_consumer_tag"])
                        for q in listing
                    ),
                    sorted(
                        (_consumer_view(c) for c in found["consumer_details"]),
                        key=lambda c: c["consumer_tag"],
                    ),
                    sorted((_consumer_view(c) for c in listed), key=lambda c: c["consumer_tag"]),
                    queue(f"{p}-plain")["exclusive_consumer_tag"],
                )
            )
            if tag == "A":
                a.rpc(1, c.Basic.Cancel(consumer_tag="A"))
                a.rpc(1, c.Basic.Consume(queue=f"{p}-sac", consumer_tag="A2"))
        a.close()
        b.close()
        views.append(view)
    rabbit, gateway = views
    assert gateway == rabbit
    assert rabbit[1][0]["single_active_consumer_tag"] == "B"
