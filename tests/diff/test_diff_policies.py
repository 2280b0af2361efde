"""Policies compared with RabbitMQ: set with rabbitmqctl on RabbitMQ and with the admin API
(PUT /api/policies/{vhost}/{name}, the management API's shape) on the gateway. A policy's
numeric limits combine with a queue's own argument by taking the smaller; clearing the policy
takes effect on the existing queue."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from pamqp import commands as c

from tests.diff.support import Server, run_both
from tests.diff.test_diff_queue_features import _count, _get_all, _wait_count
from tests.harness.processes import GatewayProcess, check_for
from tests.harness.rabbitmq import RabbitMQProcess

PolicySetter = Callable[[str, str | None, dict[str, Any]], None]


@pytest.fixture(scope="module")
def policy_setters(
    rabbitmq: RabbitMQProcess, diff_gateway: GatewayProcess
) -> dict[str, PolicySetter]:
    def on_rabbitmq(name: str, pattern: str | None, definition: dict[str, Any]) -> None:
        if pattern is None:
            rabbitmq.ctl("clear_policy", name)
        else:
            rabbitmq.ctl(
                "set_policy", "--apply-to", "queues", name, pattern, json.dumps(definition)
            )

    def on_gateway(name: str, pattern: str | None, definition: dict[str, Any]) -> None:
        path = f"/api/policies/%2F/{name}"
        if pattern is None:
            status, answer = diff_gateway.admin("DELETE", path)
        else:
            body = {"pattern": pattern, "definition": definition, "apply-to": "queues"}
            status, answer = diff_gateway.admin("PUT", path, body)
        assert status in (201, 204), answer

    return {"rabbitmq": on_rabbitmq, "gateway": on_gateway}


def test_policy_ttl_dlx_and_length_like_rabbitmq(
    servers: list[Server], names: str, policy_setters: dict[str, PolicySetter]
) -> None:
    def scenario(server: Server, p: str) -> Any:
        set_policy = policy_setters[server.name]
        definition = {"message-ttl": 100, "dead-letter-exchange": f"{p}-dlx", "max-length": 2}
        set_policy(f"{p}-pol", f"^{p}-q$", definition)
        with server.raw() as client:
            client.open_channel(1)
            client.rpc(1, c.Exchange.Declare(exchange=f"{p}-dlx", exchange_type="fanout"))
            client.rpc(1, c.Queue.Declare(queue=f"{p}-dead"))
            client.rpc(1, c.Queue.Bind(queue=f"{p}-dead", exchange=f"{p}-dlx"))
            # The queue's own x-max-length (5) loses to the policy's smaller one (2).
            client.rpc(1, c.Queue.Declare(queue=f"{p}-q", arguments={"x-max-length": 5}))
            client.rpc(1, c.Confirm.Select())
            for i in range(3):
                client.publish(1, "", f"{p}-q", b"m%d" % i)
                client.next_method(1)
            dead = _wait_count(client, f"{p}-dead", 3)
            letters = _get_all(client, f"{p}-dead")
            set_policy(f"{p}-pol", None, {})
            # Without the policy the queue keeps messages: no TTL, length 5.
            check_for(5, lambda: _publish_and_count(client, p) >= 4 or None, interval_s=0.05)
            return dead, letters, _count(client, f"{p}-q")

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit


def _publish_and_count(client: Any, p: str) -> int:
    client.publish(1, "", f"{p}-q", b"kept")
    client.next_method(1)
    return _count(client, f"{p}-q")
