"""Scaling a plain queue on the embedded node (docs/elastic-queues.md): `mqgw queue scale`
1 → 6 → 2 while pika publishers with confirms on several channels and a consumer run;
every confirmed message arrives once, each channel's in order; the removed partitions drain
and are removed; bad asks get their 400/409 and change nothing."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.harness.confirming_clients import AckingConsumer, ChannelPublishers
from tests.harness.processes import GatewayProcess, check_for
from tests.harness.rabbitmq import free_port

CHANNELS = 4


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    process = GatewayProcess(tmp_path / "data", ["--admin-port", str(free_port())]).start()
    yield process
    process.stop()


def scale_cli(gateway: GatewayProcess, queue: str, *args: str) -> subprocess.CompletedProcess[str]:
    admin = f"http://127.0.0.1:{gateway.admin_port}"
    command = [sys.executable, "-m", "mqgw_cli.main", "queue", "scale", queue, *args,
               "--admin", admin, "--user", "guest", "--password", "guest"]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def _route(gateway: GatewayProcess, queue: str) -> dict[str, Any]:
    status, route = gateway.admin("GET", f"/api/queues/%2F/{queue}/route")
    assert status == 200, route
    result: dict[str, Any] = route
    return result


def test_a_plain_queue_scales_up_and_down_under_load(gateway: GatewayProcess) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gateway.amqp_port))
    conn.channel().queue_declare("elastic", durable=True)
    consumer = AckingConsumer(gateway.url, "elastic")
    consumer.start()
    publishers = ChannelPublishers(gateway.url, "elastic", channels=CHANNELS, pause_s=0.001)
    publishers.start()
    check_for(10, lambda: len(publishers.confirmed) > 200)

    grown = scale_cli(gateway, "elastic", "--partitions", "6")
    assert grown.returncode == 0, grown.stderr
    assert "6 partitions open in" in grown.stderr
    route = _route(gateway, "elastic")
    assert [p["state"] for p in route["partitions"]] == ["open"] * 6
    check_for(10, lambda: len(publishers.confirmed) > 1500)
    shrunk = scale_cli(gateway, "elastic", "--partitions", "2")
    assert shrunk.returncode == 0, shrunk.stderr
    assert "2 partitions open in" in shrunk.stderr
    states = [p["state"] for p in _route(gateway, "elastic")["partitions"]]
    assert states == ["open"] * 2 + ["removed"] * 4  # drained by the consumer, then removed
    count_at_shrink = len(publishers.confirmed)
    check_for(10, lambda: len(publishers.confirmed) > count_at_shrink + 500)
    publishers.stop.set()
    publishers.join(10)
    check_for(20, lambda: len(consumer.received) >= len(publishers.confirmed))
    consumer.stop.set()
    consumer.join(10)

    received = consumer.bodies()
    assert publishers.nacked == 0
    assert sorted(received) == sorted(publishers.confirmed), "lost or duplicated messages"
    for c in range(CHANNELS):  # each channel's messages in the order it published them
        mine = [int(b.split(b":")[1]) for b in received if b.startswith(b"%d:" % c)]
        assert mine == sorted(mine), f"channel {c} out of order"
    route = _route(gateway, "elastic")
    assert route["in_progress"] is None and route["version"] == 3
    _, queue = gateway.admin("GET", "/api/queues/%2F/elastic")
    ends = {p["partition"]: p["max_offset"] for p in queue["mqgw"]["partition_details"]}
    for part in route["partitions"][2:]:  # nothing written after a command record
        assert ends[part["partition"]] == part["closed_at"] + 1, (part, ends)
    assert [v["change"] for v in route["versions"]] == ["declare", "grow to 6", "shrink to 2"]
    check_for(5, lambda: gateway.admin("GET", "/api/queues/%2F/elastic")[1]["messages"] == 0)
    check_for(5, lambda: "route version 3 (shrink to 2)" in gateway.log())
    conn.close()


def test_scale_refuses_what_it_cannot_do_and_changes_nothing(gateway: GatewayProcess) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gateway.amqp_port))
    ch = conn.channel()
    ch.queue_declare("plain", durable=True)
    ch.queue_declare("ranked", durable=True, arguments={"x-max-priority": 5})
    ch.queue_declare("log", durable=True, arguments={"x-queue-type": "stream"})
    asks = [
        ("plain", {"partitions": 0}, 400, '"partitions" must be at least 1'),
        ("plain", {"partitions": "3"}, 400, '"partitions" must be an integer'),
        ("plain", [3], 400, "the body must be a JSON object"),
        ("ranked", {"partitions": 3}, 409, "a priority queue keeps its partitions"),
        ("log", {"partitions": 3}, 409, "a stream queue keeps its partitions"),
        ("nowhere", {"partitions": 3}, 404, "no queue 'nowhere'"),
    ]
    for queue, body, status, reason in asks:
        got, answer = gateway.admin("POST", f"/api/queues/%2F/{queue}/scale", body)
        assert (got, reason in answer["reason"]) == (status, True), (queue, body, answer)
    got, answer = gateway.admin("POST", "/api/queues/%2F/plain/move", {"to": "g9"})
    assert got == 400 and "no broker group 'g9' on the embedded node" in answer["reason"]
    got, answer = gateway.admin("GET", "/api/queues/%2F/plain/route")
    assert got == 400 and "never scaled" in answer["reason"]  # nothing was written
    failed = scale_cli(gateway, "plain", "--partitions", "0")
    assert failed.returncode == 1 and '"partitions" must be at least 1' in failed.stderr

    ok, answer = gateway.admin("POST", "/api/queues/%2F/plain/scale", {"partitions": 3})
    assert ok == 200 and answer["complete"] and answer["route"]["open_partitions"] == 3
    same, answer = gateway.admin("POST", "/api/queues/%2F/plain/scale", {"partitions": 3})
    assert same == 200 and answer["route"]["version"] == 2  # already there: no new version
    conn.close()

    gateway.stop()  # the route and the grown store queue outlive a restart
    gateway.start()
    got, route = gateway.admin("GET", "/api/queues/%2F/plain/route")
    assert got == 200 and route["version"] == 2 and route["open_partitions"] == 3
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gateway.amqp_port))
    channels = [conn.channel() for _ in range(6)]  # spread over the three partitions
    for n, channel in enumerate(channels):
        channel.confirm_delivery()
        channel.basic_publish("", "plain", b"%d" % n)
    got_back = {channels[0].basic_get("plain", auto_ack=True)[2] for _ in range(6)}
    assert got_back == {b"%d" % n for n in range(6)}
    _, queue = gateway.admin("GET", "/api/queues/%2F/plain")
    assert queue["partitions"] == 3 and queue["messages"] == 0
    conn.close()


def test_autoscale_grows_under_a_slow_consumer_and_shrinks_when_idle(
    gateway: GatewayProcess,
) -> None:
    policy = {"pattern": "^auto$", "definition": {
        "autoscale": {"min": 1, "max": 3, "depth": 100, "window_s": 1}}}  # fmt: skip
    assert gateway.admin("PUT", "/api/policies/%2F/auto", policy)[0] in (201, 204)
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", gateway.amqp_port))
    ch = conn.channel()
    ch.queue_declare("auto", durable=True)
    ch.confirm_delivery()
    for n in range(600):  # far above depth 100; nobody consumes yet
        ch.basic_publish("", "auto", b"%d" % n)

    def partitions() -> int:
        status, queue = gateway.admin("GET", "/api/queues/%2F/auto")
        assert status == 200
        return int(queue["mqgw"]["autoscale"]["open_partitions"])

    check_for(15, lambda: partitions() == 3)  # 1 -> 2 -> 3, a window apart
    time.sleep(1.5)  # above for longer still: never past max
    assert partitions() == 3
    taken: list[bytes] = []
    while len(taken) < 600:  # the slow consumer catches up at last
        _, _, body = ch.basic_get("auto", auto_ack=True)
        if body is None:
            time.sleep(0.01)
            continue
        taken.append(body)
    assert sorted(taken, key=int) == [b"%d" % n for n in range(600)]
    check_for(20, lambda: partitions() == 1)  # idle: 3 -> 2 -> 1, never below min
    _, queue = gateway.admin("GET", "/api/queues/%2F/auto")
    steps = [(d["from"], d["to"]) for d in queue["mqgw"]["autoscale"]["decisions"]]
    assert steps == [(1, 2), (2, 3), (3, 2), (2, 1)], steps
    assert "depth" in queue["mqgw"]["autoscale"]["decisions"][0]["why"]
    assert "autoscale 3 -> 2 partitions (idle for 1 s)" in gateway.log()
    ch.basic_publish("", "auto", b"after")  # still a working queue
    assert ch.basic_get("auto", auto_ack=True)[2] == b"after"
    conn.close()
