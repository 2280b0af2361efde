"""Definitions between the real RabbitMQ 3.10 and mqgw, both ways: a file written by
`rabbitmqctl export_definitions` imports into a gateway (its users log in with their old
passwords, its bindings route), and a file the gateway exports imports into RabbitMQ with
`rabbitmqctl import_definitions`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from bench.servers import free_port
from tests.harness.processes import GatewayProcess, check_for
from tests.harness.rabbitmq import RabbitMQProcess


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    """A gateway of this test's own (the file is imported into an empty node)."""
    process = GatewayProcess(tmp_path / "gw", ["--admin-port", str(free_port())]).start()
    yield process
    process.stop()


def connect(port: int, user: str, password: str, vhost: str) -> pika.BlockingConnection:
    credentials = pika.PlainCredentials(user, password)
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, vhost, credentials))


def declare_topology(port: int, user: str, password: str, vhost: str) -> None:
    conn = connect(port, user, password, vhost)
    ch = conn.channel()
    ch.exchange_declare("events", "topic", durable=True)
    ch.exchange_declare("audit", "fanout", durable=True)
    ch.exchange_declare("hdr", "headers", durable=True, arguments={"alternate-exchange": "audit"})
    args = {"x-message-ttl": 600000, "x-dead-letter-exchange": "audit", "x-max-length": 100}
    ch.queue_declare("orders", durable=True, arguments=args)
    ch.queue_declare("capped", durable=True)
    ch.queue_declare("audit-log", durable=True, arguments={"x-overflow": "reject-publish"})
    ch.queue_declare("hq", durable=True)
    ch.queue_bind("orders", "events", "order.*")
    ch.queue_bind("capped", "events", "cap")
    ch.exchange_bind("audit", "events", "#")  # events -> audit (exchange to exchange)
    ch.queue_bind("audit-log", "audit", "")
    ch.queue_bind("hq", "hdr", "", arguments={"x-match": "any", "kind": "a"})
    conn.close()


def check_routing(port: int, user: str, password: str, vhost: str) -> None:
    """Routes through every binding kind; the policy caps "capped" at 2 messages."""
    conn = connect(port, user, password, vhost)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("events", "order.new", b"order")
    for i in range(3):
        ch.basic_publish("events", "cap", b"c%d" % i)
    ch.basic_publish("hdr", "", b"h", pika.BasicProperties(headers={"kind": "a"}))
    got = {}
    for queue in ("orders", "hq"):
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        got[queue] = body if method else None
    assert got == {"orders": b"order", "hq": b"h"}
    assert ch.queue_declare("capped", passive=True).method.message_count == 2
    # audit-log: via events -> audit for all four events publishes (not for hdr's match)
    assert ch.queue_declare("audit-log", passive=True).method.message_count == 4
    conn.close()


def only_vhost(document: dict[str, Any], vhost: str, users: set[str]) -> dict[str, Any]:
    """The session's RabbitMQ node is shared with other tests: keep this test's part."""
    kept = dict(document)
    kept["users"] = [u for u in document["users"] if u["name"] in users]
    kept["vhosts"] = [v for v in document["vhosts"] if v["name"] == vhost]
    for kind in ("permissions", "policies", "queues", "exchanges", "bindings"):
        kept[kind] = [e for e in document[kind] if e["vhost"] == vhost]
    return kept


def test_rabbitmq_export_imports_into_the_gateway(
    rabbitmq: RabbitMQProcess, gateway: GatewayProcess, names: str, tmp_path: Path
) -> None:
    vhost, alice, bob = f"{names}-vh", f"{names}-alice", f"{names}-bob"
    rabbitmq.ctl("add_vhost", vhost)
    rabbitmq.ctl("add_user", alice, "alice-pw")
    rabbitmq.ctl("set_user_tags", alice, "management")
    rabbitmq.ctl("add_user", bob, "bob-pw")
    for user in (alice, bob):
        rabbitmq.ctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
    rabbitmq.ctl("set_topic_permissions", "-p", vhost, bob, "amq.topic", "^x", "^y")
    cap = json.dumps({"max-length": 2})
    rabbitmq.ctl("set_policy", "-p", vhost, "--apply-to", "queues", "cap", "^capped$", cap)
    declare_topology(rabbitmq.amqp_port, bob, "bob-pw", vhost)
    # An exclusive queue's binding is exported by rabbitmqctl, the queue itself is not.
    holder = connect(rabbitmq.amqp_port, bob, "bob-pw", vhost)
    holder.channel().queue_declare("mine", exclusive=True)
    holder.channel().queue_bind("mine", "events", "#")
    path = tmp_path / "rabbitmq.json"
    rabbitmq.ctl("export_definitions", str(path))
    holder.close()

    written = json.loads(path.read_text())
    assert written["rabbitmq_version"].startswith("3.10.")
    document = only_vhost(written, vhost, {alice, bob})
    assert {u["hashing_algorithm"] for u in document["users"]} == {"rabbit_password_hashing_sha256"}
    status, summary = gateway.admin("POST", "/api/definitions", document)
    assert status == 200, summary
    assert summary["users"]["created"] == 2 and summary["vhosts"]["created"] == 1
    assert summary["queues"]["created"] == 4 and summary["exchanges"]["created"] == 3
    assert summary["bindings"] == {"created": 5, "updated": 0, "present": 0, "skipped": 1}
    assert summary["ignored"]["topic_permissions"] >= 1
    assert summary["warnings"] == [
        f"bindings[{i}]: no queue 'mine' in vhost '{vhost}': binding skipped"
        for i, b in enumerate(document["bindings"])
        if b["destination"] == "mine"
    ]

    for user, password in ((alice, "alice-pw"), (bob, "bob-pw")):  # their old passwords
        connect(gateway.amqp_port, user, password, vhost).close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(gateway.amqp_port, bob, "alice-pw", vhost)
    check_routing(gateway.amqp_port, bob, "bob-pw", vhost)

    status, exported = gateway.admin("GET", "/api/definitions")
    assert status == 200
    queues = {q["name"]: q["arguments"] for q in exported["queues"]}
    for queue in document["queues"]:
        assert queues[queue["name"]] == {**queue["arguments"], "x-queue-type": "classic"}
    status, again = gateway.admin("POST", "/api/definitions", document)
    assert status == 200 and again["queues"]["present"] == 4 and again["queues"]["created"] == 0


def ctl_json(rabbitmq: RabbitMQProcess, *args: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(rabbitmq.ctl(*args, "--formatter", "json"))
    return rows


def table(arguments: list[list[Any]]) -> dict[str, Any]:
    """rabbitmqctl's [[key, type, value], ...] as {key: value} (flat values only)."""
    return {key: value for key, _type, value in arguments}


def test_gateway_export_imports_into_rabbitmq(
    rabbitmq: RabbitMQProcess, gateway: GatewayProcess, names: str, tmp_path: Path
) -> None:
    vhost, carol = f"{names}-vh", f"{names}-carol"
    assert gateway.admin("PUT", f"/api/vhosts/{vhost}", {"description": "from mqgw"})[0] == 201
    assert (
        gateway.admin("PUT", f"/api/users/{carol}", {"password": "c-pw", "tags": "policymaker"})[0]
        == 201
    )
    rights = {"configure": ".*", "write": ".*", "read": ".*"}
    assert gateway.admin("PUT", f"/api/permissions/{vhost}/{carol}", rights)[0] == 201
    policy = {"pattern": "^capped$", "definition": {"max-length": 2}, "apply-to": "queues"}
    assert gateway.admin("PUT", f"/api/policies/{vhost}/cap", policy)[0] == 201
    declare_topology(gateway.amqp_port, carol, "c-pw", vhost)
    status, document = gateway.admin("GET", "/api/definitions")
    assert status == 200
    path = tmp_path / "mqgw.json"
    path.write_text(json.dumps(document))

    rabbitmq.ctl("import_definitions", str(path))

    def imported() -> bool:
        return any(v["name"] == vhost for v in ctl_json(rabbitmq, "list_vhosts", "name"))

    check_for(30, imported, interval_s=0.5)
    vhosts = ctl_json(rabbitmq, "list_vhosts", "name", "description")
    assert {"name": vhost, "description": "from mqgw"} in vhosts
    users = {u["user"]: u["tags"] for u in ctl_json(rabbitmq, "list_users")}
    assert users[carol] == ["policymaker"]
    rabbitmq.ctl("authenticate_user", carol, "c-pw")  # raises if the password is wrong
    permissions = ctl_json(rabbitmq, "list_permissions", "-p", vhost)
    assert permissions == [{"user": carol, "configure": ".*", "write": ".*", "read": ".*"}]
    policies = ctl_json(rabbitmq, "list_policies", "-p", vhost)
    assert [(p["name"], p["pattern"], json.loads(p["definition"])) for p in policies] == [
        ("cap", "^capped$", {"max-length": 2})
    ]
    queues = {
        q["name"]: (q["durable"], table(q["arguments"]))
        for q in ctl_json(rabbitmq, "list_queues", "-p", vhost, "name", "durable", "arguments")
    }
    assert queues == {
        "orders": (
            True,
            {
                "x-message-ttl": 600000,
                "x-dead-letter-exchange": "audit",
                "x-max-length": 100,
                "x-queue-type": "classic",
            },
        ),
        "capped": (True, {"x-queue-type": "classic"}),
        "audit-log": (True, {"x-overflow": "reject-publish", "x-queue-type": "classic"}),
        "hq": (True, {"x-queue-type": "classic"}),
    }
    exchanges = {
        x["name"]: (x["type"], table(x["arguments"]))
        for x in ctl_json(rabbitmq, "list_exchanges", "-p", vhost, "name", "type", "arguments")
        if x["name"] in ("events", "audit", "hdr")
    }
    assert exchanges == {
        "events": ("topic", {}),
        "audit": ("fanout", {}),
        "hdr": ("headers", {"alternate-exchange": "audit"}),
    }
    bindings = {
        (b["source_name"], b["destination_name"], b["routing_key"])
        for b in ctl_json(
            rabbitmq, "list_bindings", "-p", vhost, "source_name", "destination_name", "routing_key"
        )
        if b["source_name"]
    }
    assert bindings == {
        ("events", "orders", "order.*"),
        ("events", "capped", "cap"),
        ("events", "audit", "#"),
        ("audit", "audit-log", ""),
        ("hdr", "hq", ""),
    }
    check_routing(rabbitmq.amqp_port, carol, "c-pw", vhost)
