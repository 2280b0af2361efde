"""Definitions import/export against real gateways (admin API and `mqgw definitions`):
a round trip to a fresh node keeps users' passwords and routes at once; a refused file
changes nothing; only administrators may call it; the CLI prints progress and a summary."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from bench.servers import free_port
from tests.harness.processes import REPO, GatewayProcess


def start_gateway(data_dir: Path) -> GatewayProcess:
    return GatewayProcess(data_dir, ["--admin-port", str(free_port())]).start()


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[GatewayProcess]:
    process = start_gateway(tmp_path / "gw")
    yield process
    process.stop()


def ok(answer: tuple[int, Any], status: int = 200) -> Any:
    code, body = answer
    assert code == status, body
    return body


def export(gw: GatewayProcess, vhost: str | None = None) -> dict[str, Any]:
    path = "/api/definitions" if vhost is None else f"/api/definitions/{vhost}"
    document: dict[str, Any] = ok(gw.admin("GET", path))
    return document


def connect(gw: GatewayProcess, user: str, password: str, vhost: str) -> pika.BlockingConnection:
    credentials = pika.PlainCredentials(user, password)
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", gw.amqp_port, vhost, credentials)
    )


def build_topology(gw: GatewayProcess) -> None:
    """A vhost, a user with a password and permissions, a policy, and a topology declared
    over AMQP by that user: exchanges, queues with arguments, queue and e2e bindings."""
    ok(gw.admin("PUT", "/api/vhosts/shop", {"description": "the shop", "tags": "prod"}), 201)
    ok(gw.admin("PUT", "/api/users/app", {"password": "s3cret", "tags": "management"}), 201)
    rights = {"configure": ".*", "write": ".*", "read": ".*"}
    ok(gw.admin("PUT", "/api/permissions/shop/app", rights), 201)
    policy = {"pattern": "^orders$", "definition": {"max-length": 5}, "apply-to": "queues"}
    ok(gw.admin("PUT", "/api/policies/shop/cap", policy), 201)
    conn = connect(gw, "app", "s3cret", "shop")
    ch = conn.channel()
    ch.exchange_declare("events", "topic", durable=True)
    ch.exchange_declare("audit", "fanout", durable=True)
    ch.exchange_declare("scratch", "direct", durable=False)  # transient: not exported
    args = {"x-message-ttl": 600000, "x-dead-letter-exchange": "audit"}
    ch.queue_declare("orders", durable=True, arguments=args)
    ch.queue_declare("audit-log", durable=True, arguments={"x-max-length": 1000})
    ch.queue_bind("orders", "events", "order.*")
    ch.exchange_bind("audit", "events", "#")  # destination audit, source events
    ch.queue_bind("audit-log", "audit")
    conn.close()


def test_round_trip_to_a_fresh_gateway(gw: GatewayProcess, tmp_path: Path) -> None:
    build_topology(gw)
    original = export(gw)
    assert [q["name"] for q in original["queues"]] == ["orders", "audit-log"]
    assert {x["name"] for x in original["exchanges"]} == {"events", "audit"}
    assert original["vhosts"][1] == {
        "name": "shop",
        "limits": {},
        "metadata": {"description": "the shop", "tags": ["prod"]},
    }
    (tmp_path / "defs.json").write_text(json.dumps(original))

    fresh = start_gateway(tmp_path / "fresh")
    try:
        body = json.loads((tmp_path / "defs.json").read_text())
        summary = ok(fresh.admin("POST", "/api/definitions", body))
        assert summary["queues"] == {"created": 2, "updated": 0, "present": 0}
        assert summary["bindings"] == {"created": 3, "updated": 0, "present": 0}
        assert summary["users"] == {"created": 1, "updated": 1, "present": 0}  # app; guest
        assert export(fresh) == original

        conn = connect(fresh, "app", "s3cret", "shop")  # the password came along
        ch = conn.channel()
        for i in range(7):
            ch.basic_publish("events", "order.new", b"o%d" % i)
        conn.close()
        conn = connect(fresh, "app", "s3cret", "shop")
        ch = conn.channel()
        # The policy (max-length 5) is in force on the imported queue.
        assert ch.queue_declare("orders", passive=True).method.message_count == 5
        # The exchange-to-exchange binding routes too: events -> audit -> audit-log.
        method, _props, message = ch.basic_get("audit-log", auto_ack=True)
        assert method is not None and message == b"o0"
        conn.close()
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            connect(fresh, "app", "wrong", "shop")

        again = ok(fresh.admin("POST", "/api/definitions", body))  # idempotent
        for kind in ("vhosts", "users", "permissions", "policies", "queues", "bindings"):
            assert again[kind]["created"] == again[kind]["updated"] == 0, kind
        assert again["exchanges"] == {"created": 0, "updated": 0, "present": 2}
        assert export(fresh) == original
    finally:
        fresh.stop()


def test_a_refused_file_changes_nothing(gw: GatewayProcess) -> None:
    ok(gw.admin("PUT", "/api/vhosts/v1"), 201)
    conn = connect(gw, "guest", "guest", "/")
    conn.channel().queue_declare("kept", durable=True)
    conn.close()
    before = export(gw)
    new_things = {
        "vhosts": [{"name": "v2"}],
        "users": [{"name": "u2", "password_hash": "", "tags": []}],
        "permissions": [{"user": "u2", "vhost": "v2", "configure": "", "write": "", "read": ""}],
        "exchanges": [{"name": "x2", "vhost": "/", "type": "fanout"}],
    }
    good = {"vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}
    cases = {
        "bad type": (
            [{**good, "name": f"q{i}"} for i in range(3)]
            + [{**good, "name": "q3", "durable": "yes"}],
            "queues[3].durable: Input should be a valid boolean",
        ),
        "invalid argument": (
            [{**good, "name": "fine"}, {**good, "name": "neg", "arguments": {"x-expires": 0}}],
            "queues[1]: invalid arg 'x-expires' for queue 'neg' in vhost '/': {value_zero,0}",
        ),
        "not equivalent": (
            [{**good, "name": "new"}, {**good, "name": "kept", "auto_delete": True}],
            "queues[1]: inequivalent arg 'auto_delete' for queue 'kept' in vhost '/': "
            "received 'true' but current is 'false'",
        ),
    }
    for case, (queues, reason) in cases.items():
        status, answer = gw.admin("POST", "/api/definitions", {**new_things, "queues": queues})
        assert (status, answer) == (400, {"error": "bad_request", "reason": reason}), case
        assert export(gw) == before, case
    status, answer = gw.admin("POST", "/api/definitions", b'{"queues": [')
    assert status == 400 and answer["error"] == "bad_request", answer
    assert answer["reason"].startswith("failed_to_parse_json"), answer
    assert export(gw) == before

    # Unknown fields are accepted (RabbitMQ's future fields, other tools' extras).
    extra = {**good, "name": "extra", "type": "classic", "node": "rabbit@elsewhere"}
    ok(gw.admin("POST", "/api/definitions", {"queues": [extra], "something_new": [1]}))
    assert "extra" in [q["name"] for q in export(gw)["queues"]]


def test_only_administrators(gw: GatewayProcess) -> None:
    ok(gw.admin("PUT", "/api/users/watcher", {"password": "pw", "tags": "management"}), 201)
    for method, path in (
        ("GET", "/api/definitions"),
        ("POST", "/api/definitions"),
        ("GET", "/api/definitions/%2F"),
        ("POST", "/api/definitions/%2F"),
    ):
        body = {} if method == "POST" else None
        assert gw.admin(method, path, body, auth=None)[0] == 401, path
        assert gw.admin(method, path, body, auth=("watcher", "pw"))[0] == 403, path
        assert gw.admin(method, path, body, auth=("guest", "wrong"))[0] == 401, path
    assert export(gw)["users"][-1]["name"] == "watcher"


def test_per_vhost_export_and_import(gw: GatewayProcess) -> None:
    conn = connect(gw, "guest", "guest", "/")
    ch = conn.channel()
    ch.exchange_declare("x", "direct", durable=True)
    ch.queue_declare("q", durable=True, arguments={"x-max-length": 3})
    ch.queue_bind("q", "x", "k")
    conn.close()
    document = export(gw, "%2F")
    assert list(document) == [
        "rabbit_version", "parameters", "policies", "queues", "exchanges", "bindings",
    ]  # fmt: skip
    assert document["queues"] == [
        {
            "name": "q",
            "durable": True,
            "auto_delete": False,
            "arguments": {"x-max-length": 3, "x-queue-type": "classic"},
        }
    ]
    assert "vhost" not in document["bindings"][0]
    ok(gw.admin("PUT", "/api/vhosts/copy"), 201)
    summary = ok(gw.admin("POST", "/api/definitions/copy", document))
    assert summary["bindings"]["created"] == 1
    copied = export(gw, "copy")
    assert (copied["queues"], copied["bindings"]) == (document["queues"], document["bindings"])
    assert gw.admin("GET", "/api/definitions/nope") == (
        400,
        {"error": "bad_request", "reason": "vhost_not_found"},
    )
    assert gw.admin("POST", "/api/definitions/nope", {}) == (
        404,
        {"error": "not_found", "reason": "vhost_not_found"},
    )


def mqgw(
    gw: GatewayProcess, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    admin = [
        "--admin",
        f"http://127.0.0.1:{gw.admin_port}",
        "--user",
        "guest",
        "--password",
        "guest",
    ]
    return subprocess.run(
        [sys.executable, "-m", "mqgw_cli.main", "definitions", *args, *admin],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_export_and_import_with_progress_and_summary(
    gw: GatewayProcess, tmp_path: Path
) -> None:
    many = {
        "queues": [
            {"name": f"bulk.{i}", "vhost": "/", "durable": True, "arguments": {"x-max-length": 9}}
            for i in range(1500)
        ],
        "bindings": [
            {"source": "amq.direct", "vhost": "/", "destination": f"bulk.{i}",
             "destination_type": "queue", "routing_key": f"k{i}"}
            for i in range(1500)
        ],
    }  # fmt: skip
    big = tmp_path / "big.json"
    big.write_text(json.dumps(many))
    done = mqgw(gw, "import", str(big))
    assert done.returncode == 0, done.stderr
    assert "importing " in done.stderr and "1500 queues, 1500 bindings" in done.stderr
    assert "checked: 3000 changes to apply" in done.stderr
    assert done.stdout.startswith(f"imported {big} in ")
    assert "queues 1500 created, 0 present; bindings 1500 created, 0 present" in done.stdout

    out = tmp_path / "out.json"
    exported = mqgw(gw, "export", str(out))
    assert exported.returncode == 0, exported.stderr
    assert "1500 queues" in exported.stderr
    assert json.loads(out.read_text()) == export(gw)

    again = mqgw(gw, "import", str(out))
    assert again.returncode == 0, again.stderr
    assert "queues 0 created, 1500 present; bindings 0 created, 1500 present" in again.stdout

    one = mqgw(gw, "export", "-", "--vhost", "/")
    assert one.returncode == 0 and len(json.loads(one.stdout)["queues"]) == 1500

    bad = {"queues": [{"name": "b", "vhost": "/", "arguments": {"x-max-length": "x"}}]}
    refused = mqgw(gw, "import", "-", stdin=json.dumps(bad))
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"import refused: POST http://127.0.0.1:{gw.admin_port}/api/definitions answered 400 "
        "queues[0]: invalid arg 'x-max-length' for queue 'b' "
        "in vhost '/': \"expected integer, got longstr\""
    )
    assert mqgw(gw, "import", "-", "--vhost", "nope", stdin="{}").returncode == 1


@pytest.mark.parametrize("algorithm", ["md5", "sha512"])
def test_users_hashed_with_older_or_other_modules_log_in(
    gw: GatewayProcess, algorithm: str
) -> None:
    salt = bytes.fromhex("0a1b2c3d")
    stored = base64.b64encode(salt + hashlib.new(algorithm, salt + b"pw-1").digest()).decode()
    user = {"name": "old", "password_hash": stored, "tags": []}
    if algorithm == "sha512":
        user["hashing_algorithm"] = "rabbit_password_hashing_sha512"
    document = {
        "rabbit_version": "3.5.7" if algorithm == "md5" else "3.10.8",  # 3.5: md5 by default
        "users": [user],
        "permissions": [
            {"user": "old", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}
        ],
    }
    ok(gw.admin("POST", "/api/definitions", document))
    connect(gw, "old", "pw-1", "/").close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        connect(gw, "old", "pw-2", "/")
    exported = next(u for u in export(gw)["users"] if u["name"] == "old")
    assert exported["hashing_algorithm"] == f"rabbit_password_hashing_{algorithm}"
