"""Offset reset by time (POST /api/queues/{vhost}/{name}/reset, `mqgw queue reset`) against a
real gateway: replay after consumption, skip forward, the answers' counts, refusals."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import time

from pamqp import commands as c

from tests.diff.raw import Message, RawClient
from tests.harness.processes import REPO, GatewayProcess, check_for


def _client(gateway: GatewayProcess) -> RawClient:
    client = RawClient(gateway.amqp_port)
    client.connect()
    client.open_channel(1)
    return client


def _publish(client: RawClient, queue: str, bodies: list[bytes]) -> None:
    for body in bodies:
        client.publish(1, "", queue, body)
        assert isinstance(client.next_method(1), c.Basic.Ack)


def _get_all(client: RawClient, queue: str) -> list[bytes]:
    bodies = []
    while isinstance(got := client.rpc(1, c.Basic.Get(queue=queue, no_ack=True)), Message):
        bodies.append(got.body)
    return bodies


def _committed(gateway: GatewayProcess, queue: str, offset: int) -> bool | None:
    _, info = gateway.admin("GET", f"/api/queues/%2F/{queue}")
    return info["mqgw"]["partition_details"][0]["stored_committed_offset"] == offset or None


def test_reset_replays_and_skips(gateway: GatewayProcess) -> None:
    client = _client(gateway)
    client.rpc(1, c.Queue.Declare(queue="orders"))
    client.rpc(1, c.Confirm.Select())
    _publish(client, "orders", [b"a%d" % i for i in range(5)])
    time.sleep(0.05)
    middle_ms = time.time_ns() // 1_000_000
    time.sleep(0.05)
    _publish(client, "orders", [b"b%d" % i for i in range(5)])
    assert len(_get_all(client, "orders")) == 10
    check_for(5, lambda: _committed(gateway, "orders", 10))

    status, answer = gateway.admin("POST", "/api/queues/%2F/orders/reset", {"timestamp": middle_ms})
    assert status == 200, answer
    assert (answer["replayed"], answer["skipped"], answer["messages_ready"]) == (5, 0, 5)
    assert answer["partitions"][0]["from_offset"] == 10
    assert answer["partitions"][0]["to_offset"] == 5
    assert _get_all(client, "orders") == [b"b%d" % i for i in range(5)]

    _publish(client, "orders", [b"c%d" % i for i in range(3)])
    later = dt.datetime.now(tz=dt.UTC) + dt.timedelta(seconds=5)
    command = [
        str(REPO / ".venv/bin/mqgw"),
        "queue",
        "reset",
        "orders",
        "--to",
        later.isoformat(),
        "--admin",
        f"http://127.0.0.1:{gateway.admin_port}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert (answer["skipped"], answer["replayed"], answer["messages_ready"]) == (3, 0, 0)
    assert "3 skipped" in done.stderr
    assert _get_all(client, "orders") == []
    client.close()


def test_reset_refusals(gateway: GatewayProcess) -> None:
    client = _client(gateway)
    client.rpc(1, c.Queue.Declare(queue="plain"))
    client.rpc(1, c.Queue.Declare(queue="s", durable=True, arguments={"x-queue-type": "stream"}))
    client.close()
    path = "/api/queues/%2F/plain/reset"
    for body in [{}, {"timestamp": "x"}, {"to": "yesterday"}, {"timestamp": 1, "to": 2}, [1]]:
        status, answer = gateway.admin("POST", path, body)
        assert status == 400 and answer["error"] == "bad_request", (body, answer)
    assert gateway.admin("POST", path, {"to": "2026-01-01T00:00:00"})[0] == 200
    assert gateway.admin("POST", path, {"to": "1700000000000"})[0] == 200
    status, answer = gateway.admin("POST", "/api/queues/%2F/s/reset", {"timestamp": 0})
    assert status == 400 and "stream" in answer["reason"]
    status, answer = gateway.admin("POST", "/api/queues/%2F/none/reset", {"timestamp": 0})
    assert (status, answer["error"]) == (404, "not_found")
    assert gateway.admin("POST", path, {"timestamp": 0}, auth=None)[0] == 401
    done = subprocess.run(
        [str(REPO / ".venv/bin/mqgw"), "queue", "reset", "none", "--to", "0", "--admin",
         f"http://127.0.0.1:{gateway.admin_port}"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "404" in done.stderr
