"""Per-vhost limits compared with RabbitMQ 3.10: set with rabbitmqctl set_vhost_limits on
RabbitMQ and with the admin API (PUT/DELETE /api/vhost-limits/{vhost}/{name}) on the gateway;
the same client actions get the same codes and texts. Each test has a vhost of its own."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pamqp import commands as c

from tests.diff.raw import RawClient, describe_close
from tests.diff.support import Server, run_both
from tests.harness.processes import GatewayProcess, check_for
from tests.harness.rabbitmq import RabbitMQProcess

Admin = dict[str, Callable[..., Any]]


@pytest.fixture(scope="module")
def admin(rabbitmq: RabbitMQProcess, diff_gateway: GatewayProcess) -> Iterator[Admin]:
    """Per server: add_vhost(vh), set_limits(vh, limits) (replacing them all, as
    set_vhost_limits does), export() and import_(document) of the definitions. The vhosts
    made are deleted at the end: the servers are shared with other tests."""

    def gateway(method: str, path: str, body: object = None) -> Any:
        status, answer = diff_gateway.admin(method, path, body)
        assert status in (200, 201, 204), (method, path, status, answer)
        return answer

    def gateway_limits(vhost: str, limits: dict[str, int]) -> None:
        for entry in gateway("GET", f"/api/vhost-limits/{vhost}"):
            for name in entry["value"] or {}:
                gateway("DELETE", f"/api/vhost-limits/{vhost}/{name}")
        for name, value in limits.items():
            gateway("PUT", f"/api/vhost-limits/{vhost}/{name}", {"value": value})

    made: list[str] = []  # each added to both servers (the import's copies too)

    def gateway_vhost(vhost: str) -> None:
        made.append(vhost)
        gateway("PUT", f"/api/vhosts/{vhost}", {})
        rights = {"configure": ".*", "write": ".*", "read": ".*"}
        gateway("PUT", f"/api/permissions/{vhost}/guest", rights)

    def gateway_import(document: dict[str, Any]) -> None:
        made.extend(v["name"] for v in document.get("vhosts", []))
        gateway("POST", "/api/definitions", document)

    def rabbit_vhost(vhost: str) -> None:
        rabbitmq.ctl("add_vhost", vhost)
        rabbitmq.ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")

    def rabbit_import(document: dict[str, Any]) -> None:
        path = rabbitmq.base_dir / "import.json"
        path.write_text(json.dumps(document))
        rabbitmq.ctl("import_definitions", str(path))

    yield {
        "rabbitmq": {
            "add_vhost": rabbit_vhost,
            "set_limits": lambda vh, limits: rabbitmq.ctl(
                "set_vhost_limits", "-p", vh, json.dumps(limits)
            ),
            "export": lambda: json.loads(rabbitmq.ctl("export_definitions", "-", "--silent")),
            "import_": rabbit_import,
        },
        "gateway": {
            "add_vhost": gateway_vhost,
            "set_limits": gateway_limits,
            "export": lambda: gateway("GET", "/api/definitions"),
            "import_": gateway_import,
        },
    }
    for vhost in made:
        rabbitmq.ctl("delete_vhost", vhost)
        diff_gateway.admin("DELETE", f"/api/vhosts/{vhost}")


def _open(server: Server, vhost: str) -> tuple[RawClient, Any]:
    """A connection to ``vhost``: (client, "open" or the connection.close it got)."""
    client = RawClient(server.port, vhost=vhost)
    reply = client.connect()
    if isinstance(reply, c.Connection.Close):
        return client, describe_close(reply)
    return client, "open"


def _opened(server: Server, vhost: str) -> RawClient | None:
    client, outcome = _open(server, vhost)
    if outcome == "open":
        return client
    client.close()
    return None


@pytest.fixture
def clients() -> Iterator[dict[str, list[RawClient]]]:
    """The connections each server's scenario left open, closed at the end."""
    opened: dict[str, list[RawClient]] = {"rabbitmq": [], "gateway": []}
    yield opened
    for client in [*opened["rabbitmq"], *opened["gateway"]]:
        client.close()


def test_max_connections_like_rabbitmq(
    servers: list[Server], names: str, admin: Admin, clients: dict[str, list[RawClient]]
) -> None:
    def scenario(server: Server, p: str) -> Any:
        calls, vhost, opened = admin[server.name], f"{p}-vh", clients[server.name]
        calls["add_vhost"](vhost)
        calls["set_limits"](vhost, {"max-connections": 2})
        outcomes = []
        for _ in range(3):  # the third is refused at connection.open
            client, outcome = _open(server, vhost)
            opened.append(client)
            outcomes.append(outcome)
        opened.pop(0).close()  # a place frees up (once the server has counted the close)
        opened.append(check_for(5, lambda: _opened(server, vhost), 0.05, f"{server.name} admits"))
        outcomes.append("open")
        calls["set_limits"](vhost, {"max-connections": 0})  # none at all; open ones stay
        client, outcome = _open(server, vhost)
        opened.append(client)
        outcomes.append(outcome)
        calls["set_limits"](vhost, {"max-connections": -1})  # no limit
        client, outcome = _open(server, vhost)
        opened.append(client)
        outcomes.append(outcome)
        _, other = _open(server, "/")  # other vhosts are not limited
        outcomes.append(other)
        return outcomes

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit
    assert rabbit[2][:2] == ("connection", 530)


def _declare(client: RawClient, channel: int, queue: str, **options: Any) -> Any:
    reply = client.rpc(channel, c.Queue.Declare(queue=queue, **options))
    if isinstance(reply, c.Channel.Close):
        client.send(channel, c.Channel.CloseOk())
        kind, code, text, class_id, method_id = describe_close(reply)
        return kind, code, re.sub(r"amq\.gen-[\w-]+", "amq.gen-*", text), class_id, method_id
    return "amq.gen-*" if reply.queue.startswith("amq.gen-") else reply.queue


def test_max_queues_like_rabbitmq(servers: list[Server], names: str, admin: Admin) -> None:
    def scenario(server: Server, p: str) -> Any:
        calls, vhost = admin[server.name], f"{p}-vh"
        calls["add_vhost"](vhost)
        client = RawClient(server.port, vhost=vhost)
        client.connect()
        try:
            client.open_channel(1)
            outcomes = [_declare(client, 1, "a")]
            calls["set_limits"](vhost, {"max-queues": 2})
            outcomes += [_declare(client, 1, "b"), _declare(client, 1, "a")]
            outcomes.append(_declare(client, 1, "a", passive=True))
            for channel, queue in ((2, "c"), (3, ""), (4, "x")):  # named, server-named
                client.open_channel(channel)
                outcomes.append(_declare(client, channel, queue, exclusive=queue == "x"))
            # Lowered below the count: both queues stay, redeclaring them works.
            calls["set_limits"](vhost, {"max-queues": 1})
            client.open_channel(5)
            outcomes += [_declare(client, 5, "a"), _declare(client, 5, "b", passive=True)]
            outcomes.append(_declare(client, 5, "d"))
            calls["set_limits"](vhost, {"max-queues": 3})  # raised: room for one more
            client.open_channel(6)
            outcomes += [_declare(client, 6, "d"), _declare(client, 6, "e")]
            return outcomes
        finally:
            client.close()

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit
    assert rabbit[4][:2] == ("channel", 406)


def test_limits_go_through_definitions_export_and_import(
    servers: list[Server], names: str, admin: Admin
) -> None:
    def scenario(server: Server, p: str) -> Any:
        calls, vhost = admin[server.name], f"{p}-vh"
        calls["add_vhost"](vhost)
        calls["set_limits"](vhost, {"max-connections": 4, "max-queues": 7})
        mine = [e for e in calls["export"]()["parameters"] if e["vhost"] == vhost]
        # Into a vhost the document creates, then replacing the limits of an existing one.
        moved = [{**e, "vhost": f"{p}-copy"} for e in mine]
        calls["import_"]({"vhosts": [{"name": f"{p}-copy"}], "parameters": moved})
        replaced = [{**e, "value": {"max-queues": 1}} for e in mine]
        calls["import_"]({"parameters": replaced})
        exported = calls["export"]()["parameters"]
        return mine, sorted(
            (e for e in exported if e["vhost"] in (vhost, f"{p}-copy")), key=lambda e: e["vhost"]
        )

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit
    assert rabbit[0][0]["component"] == "vhost-limits"
