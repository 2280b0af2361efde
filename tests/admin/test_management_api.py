"""The management endpoints against RabbitMQ 3.10 where the answer can be compared (statuses
for bad input, pagination, closing a connection with a reason) and on their own for what only
mqgw has (the overview's store figures, partition offsets and lag)."""

from __future__ import annotations

import base64
import json
import re
import urllib.error
import urllib.request
from typing import Any

import pika
import pytest
from pika.exceptions import ConnectionClosedByBroker

from bench.servers import check_for
from tests.admin.conftest import AdminTarget
from tests.harness.processes import GatewayProcess


def call(
    target: AdminTarget,
    method: str,
    path: str,
    body: bytes | None = None,
    user: tuple[str, str] = ("guest", "guest"),
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    request = urllib.request.Request(target.base + path, data=body, method=method)
    token = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as error:
        text = error.read()
        return error.code, json.loads(text) if text else None


BAD_INPUT = [
    ("GET", "/api/queues/no-such-vhost", None),
    ("GET", "/api/exchanges/no-such-vhost", None),
    ("GET", "/api/bindings/no-such-vhost", None),
    ("GET", "/api/queues/%2F/no-such-queue", None),
    ("GET", "/api/exchanges/%2F/no-such-exchange", None),
    ("PUT", "/api/queues/no-such-vhost/q", b'{"durable": true}'),
    ("PUT", "/api/queues/%2F/bad.json", b'{"durable": tr'),
    ("PUT", "/api/exchanges/%2F/bad.json", b"[1, 2"),
    ("PUT", "/api/exchanges/%2F/bad.type", b'{"type": "no-such-type"}'),
    ("DELETE", "/api/queues/%2F/no-such-queue", None),
    ("DELETE", "/api/exchanges/%2F/no-such-exchange", None),
    ("DELETE", "/api/queues/%2F/no-such-queue/contents", None),
    ("DELETE", "/api/connections/no-such-connection", None),
    ("POST", "/api/bindings/%2F/e/amq.direct/q/no-such-queue", b"{}"),
    ("POST", "/api/bindings/%2F/e/no-such-exchange/q/q", b"{}"),
    (
        "POST",
        "/api/exchanges/%2F/no-such-exchange/publish",
        b'{"routing_key": "", "payload": "", "properties": {}, "payload_encoding": "string"}',
    ),
]


@pytest.mark.parametrize(("method", "path", "body"), BAD_INPUT)
def test_bad_input_gets_rabbitmqs_status_in_the_error_shape(
    targets: list[AdminTarget], method: str, path: str, body: bytes | None
) -> None:
    (expected, _), (status, answer) = (call(t, method, path, body) for t in targets)
    assert status == expected, answer
    assert set(answer) == {"error", "reason"}


def test_a_user_without_the_tag_is_refused(
    admin_gateway: GatewayProcess, targets: list[AdminTarget]
) -> None:
    for target in targets:
        for name, tags in (("t-plain", ""), ("t-mgmt", "management")):
            body = json.dumps({"password": "pw", "tags": tags}).encode()
            assert call(target, "PUT", f"/api/users/{name}", body)[0] in (201, 204)
    rabbitmq, gateway = targets
    for user, path in (("t-plain", "/api/overview"), ("t-mgmt", "/api/nodes")):
        # RabbitMQ answers 401 (not_authorised); mqgw's auth.py answers 403 for a valid login
        # without the tag (documented there). Both refuse, in the error shape.
        assert call(rabbitmq, "GET", path, user=(user, "pw"))[0] == 401
        status, answer = call(gateway, "GET", path, user=(user, "pw"))
        assert status == 403 and set(answer) == {"error", "reason"}
    assert call(gateway, "GET", "/api/overview", user=("t-mgmt", "pw"))[0] == 200


def test_pagination_sort_and_columns_as_rabbitmq(targets: list[AdminTarget]) -> None:
    for target in targets:
        for name in ("pg.b", "pg.a", "pg.c", "other.pg"):
            assert call(target, "PUT", f"/api/queues/%2F/{name}", b"{}")[0] in (201, 204)
    query = "/api/queues/%2F?page=2&page_size=2&name=%5Epg%5C.&use_regex=true&columns=name,durable"
    (_, expected), (_, actual) = (call(t, "GET", query) for t in targets)
    for page in (expected, actual):
        page.pop("total_count")  # the whole vhost: other tests' queues too
    assert actual == expected == {
        "filtered_count": 3, "item_count": 1, "items": [{"name": "pg.c", "durable": False}],
        "page": 2, "page_count": 2, "page_size": 2,
    }  # fmt: skip
    query = "/api/queues/%2F?name=pg&sort=name&sort_reverse=true&columns=name"
    (_, expected), (_, actual) = (call(t, "GET", query) for t in targets)
    assert actual == expected == [{"name": n} for n in ("pg.c", "pg.b", "pg.a", "other.pg")]
    assert [call(t, "GET", "/api/queues?page=9")[0] for t in targets] == [400, 400]
    for target in targets:
        for name in ("pg.b", "pg.a", "pg.c", "other.pg"):
            call(target, "DELETE", f"/api/queues/%2F/{name}")


def test_closing_a_connection_with_a_reason_as_rabbitmq(targets: list[AdminTarget]) -> None:
    replies = []
    for target in targets:
        connection = pika.BlockingConnection(
            pika.URLParameters(target.amqp_url + "?heartbeat=0"),
        )
        local = connection._impl._transport._sock.getsockname()[1]  # where it connected from

        def find(target: AdminTarget = target, local: int = local) -> str | None:
            _status, rows = call(target, "GET", "/api/connections")
            names = [r["name"] for r in rows if r["peer_port"] == local]
            return names[0] if names else None

        name = check_for(15, find, interval_s=0.2)
        path = "/api/connections/" + urllib.request.quote(name, safe="")
        status, _ = call(target, "DELETE", path, headers={"X-Reason": "maintenance window"})
        assert status == 204
        with pytest.raises(ConnectionClosedByBroker) as closed:
            connection.process_data_events(time_limit=10)
            connection.process_data_events(time_limit=10)
        replies.append((closed.value.reply_code, closed.value.reply_text))
    assert replies[1] == replies[0] == (320, "CONNECTION_FORCED - maintenance window")


def test_overview_channels_and_queue_offsets(admin_gateway: GatewayProcess) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(admin_gateway.url))
    channel = connection.channel()
    channel.queue_declare("ov.lag")
    channel.confirm_delivery()
    for i in range(5):
        channel.basic_publish("", "ov.lag", f"m{i}".encode())
    status, overview = admin_gateway.admin("GET", "/api/overview?msg_rates_age=60&msg_rates_incr=5")
    assert status == 200
    assert set(overview["object_totals"]) == {"connections", "channels", "consumers", "exchanges",
                                              "queues"}  # fmt: skip
    assert overview["object_totals"]["connections"] >= 1
    assert overview["queue_totals"]["messages_ready"] >= 5
    assert overview["message_stats"]["publish"] >= 5
    assert isinstance(overview["message_stats"]["publish_details"]["rate"], float)
    assert "samples" in overview["message_stats"]["deliver_get_details"]
    assert overview["mqgw"]["store"]["disk_bytes"] > 0
    status, channels = admin_gateway.admin("GET", "/api/channels")
    mine = [c for c in channels if c["confirm"]]
    assert mine and mine[0]["number"] == 1 and mine[0]["user"] == "guest"
    status, queue = admin_gateway.admin("GET", "/api/queues/%2F/ov.lag")
    assert (queue["messages"], queue["messages_ready"], queue["type"]) == (5, 5, "classic")
    assert queue["message_stats"]["publish"] == 5
    [partition] = queue["mqgw"]["partition_details"]
    assert (partition["min_offset"], partition["max_offset"], partition["lag_messages"]) == (
        0,
        5,
        5,
    )
    assert partition["lag_seconds"] is not None and partition["lag_seconds"] >= 0
    assert re.fullmatch(r"running|stopped", queue["state"])
    channel.queue_delete("ov.lag")
    connection.close()
