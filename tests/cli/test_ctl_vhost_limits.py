"""`mqgw ctl set-vhost-limits` / `clear-vhost-limits` and the /api/vhost-limits endpoints
they call, on a real gateway: the set replaces the vhost's limits whole, clear removes one or
all; the API wants an administrator and answers bad names and values with RabbitMQ's 400
texts, and an unknown vhost with 404."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster.ports import free_port
from tests.cli.commands import clean_env, mqgw
from tests.harness.processes import GatewayProcess

USERS = [
    {"name": "ops", "password": "s3cret", "tags": ["administrator"]},
    {"name": "watcher", "password": "w", "tags": ["monitoring"]},
]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    args = ["--users", json.dumps(USERS), "--admin-port", str(free_port())]
    process = GatewayProcess(tmp_path_factory.mktemp("gw") / "data", args).start()
    yield process
    process.stop()


def _ctl(gateway: GatewayProcess, tmp_path: Path, *args: str) -> tuple[int, str]:
    env = clean_env(
        tmp_path,
        MQGW_ADMIN_URL=f"http://127.0.0.1:{gateway.admin_port}",
        MQGW_ADMIN_USER="ops",
        MQGW_ADMIN_PASSWORD="s3cret",
    )
    done = mqgw("ctl", *args, env=env)
    return done.returncode, done.stderr.strip()


def _limits(gateway: GatewayProcess, vhost: str = "%2F") -> object:
    status, body = gateway.admin("GET", f"/api/vhost-limits/{vhost}", auth=("ops", "s3cret"))
    assert status == 200, body
    return body


def test_ctl_sets_replaces_and_clears_limits(gateway: GatewayProcess, tmp_path: Path) -> None:
    limits = '{"max-connections": 10, "max-queues": 5}'
    assert _ctl(gateway, tmp_path, "set-vhost-limits", "/", limits) == (
        0,
        "vhost '/': limits set",
    )
    assert _limits(gateway) == [{"vhost": "/", "value": {"max-connections": 10, "max-queues": 5}}]
    assert _ctl(gateway, tmp_path, "set-vhost-limits", "/", '{"max-queues": -1}')[0] == 0
    assert _limits(gateway) == [{"vhost": "/", "value": {"max-queues": -1}}]
    assert _ctl(gateway, tmp_path, "set-vhost-limits", "/", '{"max-connections": 3}')[0] == 0
    assert _ctl(gateway, tmp_path, "clear-vhost-limits", "/", "max-queues")[0] == 0
    assert _limits(gateway) == [{"vhost": "/", "value": {"max-connections": 3}}]
    assert _ctl(gateway, tmp_path, "clear-vhost-limits", "/") == (0, "vhost '/': limits cleared")
    assert _limits(gateway) == [{"vhost": "/", "value": []}]  # RabbitMQ keeps the empty set
    code, text = _ctl(gateway, tmp_path, "set-vhost-limits", "/", '{"max-foo": 1}')
    assert code == 1 and 'Unrecognised terms [{<<"max-foo">>,1}] in limits' in text, text
    code, text = _ctl(gateway, tmp_path, "set-vhost-limits", "nowhere", '{"max-queues": 1}')
    assert code == 1 and "404" in text, text


def test_the_api_checks_who_asks_and_what(gateway: GatewayProcess) -> None:
    ops = ("ops", "s3cret")
    path = "/api/vhost-limits/%2F/max-queues"
    assert gateway.admin("GET", "/api/vhost-limits", auth=("watcher", "w"))[0] == 403
    assert gateway.admin("PUT", path, {"value": 1}, auth=("watcher", "w"))[0] == 403
    invalid = "Validation failed\n\nmax-queues should be a number, actually was "
    cases = [
        ({"value": "3"}, invalid + '<<"3">>\n'),
        ({"value": 2.5}, invalid + "2.5\n"),
        ({}, "[{key_missing,value}]"),
    ]
    for body, reason in cases:
        assert gateway.admin("PUT", path, body, auth=ops) == (
            400,
            {"error": "bad_request", "reason": reason},
        )
    assert gateway.admin("GET", "/api/vhost-limits/nowhere", auth=ops)[0] == 404
    assert (
        gateway.admin("PUT", "/api/vhost-limits/nowhere/max-queues", {"value": 1}, auth=ops)[0]
        == 404
    )
