"""`mqgw queue rescale` and its admin API against a real gateway (docs/ordering.md): a split
with --wait shows the drain and ends on the new route; --partitions N gets there one step at
a time; QMQ's constraints answer 409 with the reason; the route shows where each consumer
is; a queue that is not keyed, a bad body, a missing tag are refused."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from localcluster.ports import free_port
from tests.cli.commands import clean_env, mqgw
from tests.harness.processes import GatewayProcess

KEYED = {"x-mqgw-ordering": "key", "x-mqgw-partitions": 2, "x-mqgw-logical-partitions": 64,
         "x-mqgw-ordering-header": "key"}  # fmt: skip


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    process = GatewayProcess(tmp_path / "data", ["--admin-port", str(free_port())]).start()
    yield process
    process.stop()


def _rescale(gateway: GatewayProcess, home: Path, *args: str) -> tuple[int, str, str]:
    url = f"http://127.0.0.1:{gateway.admin_port}"
    env = clean_env(home, MQGW_ADMIN_URL=url, MQGW_ADMIN_USER="guest", MQGW_ADMIN_PASSWORD="guest")
    done = mqgw("queue", "rescale", *args, env=env)
    return done.returncode, done.stdout, done.stderr.strip()


def _route(gateway: GatewayProcess, queue: str = "orders") -> dict[str, Any]:
    status, body = gateway.admin("GET", f"/api/queues/%2F/{queue}/route")
    assert status == 200, body
    return dict(body)


def _declare_and_publish(gateway: GatewayProcess, count: int) -> None:
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
        channel = conn.channel()
        channel.queue_declare("orders", durable=True, arguments=KEYED)
        channel.queue_declare("plain", durable=True)
        channel.confirm_delivery()
        for n in range(count):
            properties = pika.BasicProperties(delivery_mode=2, headers={"key": f"k{n % 10}"})
            channel.basic_publish("", "orders", f"k{n % 10}:{n}".encode(), properties)


def test_split_waits_for_the_drain_and_the_route_says_where_everyone_is(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    _declare_and_publish(gateway, 40)
    route = _route(gateway)
    assert (route["version"], route["open_partitions"], route["in_progress"]) == (1, 2, None)
    assert [p["range"] for p in route["partitions"]] == [[0, 32], [32, 64]]

    # Nobody consumes: the split is made, and its old partition drains only when read.
    code, out, text = _rescale(gateway, tmp_path, "orders", "--split", "0", "--at", "16")
    assert code == 0, text
    shown = json.loads(out)
    assert shown["version"] == 2 and shown["open_partitions"] == 3
    part0 = shown["partitions"][0]
    assert part0["state"] == "draining" and part0["range"] is None
    assert isinstance(part0["closed_at"], int)
    assert [p["range"] for p in shown["partitions"][2:]] == [[0, 16], [16, 32]]
    assert [p["gate"] for p in shown["partitions"][2:]] == ["waiting", "waiting"]
    assert shown["in_progress"].startswith("a change is in progress: version 2")

    # One change at a time: 409 with the reason, also for the second count.
    code, _, text = _rescale(gateway, tmp_path, "orders", "--split", "1")
    assert code == 1 and "answered 409 a change is in progress: version 2" in text, text

    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=5)
        got = []
        for method, _props, body in channel.consume("orders", inactivity_timeout=5):
            if method is None:
                break
            got.append(body.decode())
            route = _route(gateway)
            holders = {p["consumer"]["consumer_tag"] for p in route["partitions"]
                       if p["consumer"]}  # fmt: skip
            assert holders == {method.consumer_tag}  # one consumer holds every partition
            channel.basic_ack(method.delivery_tag)
            if len(got) == 40:
                break
        channel.cancel()
    assert sorted(got) == sorted(f"k{n % 10}:{n}" for n in range(40))
    code, out, text = _rescale(gateway, tmp_path, "orders", "--partitions", "5", "--wait")
    assert code == 0, text
    final = json.loads(out)
    assert final["open_partitions"] == 5 and final["in_progress"] is None
    assert final["partitions"][0]["state"] == "removed"
    assert re.search(r"orders: route version \d+, partitions .* in \d+\.\d\d s$", text), text


def test_constraints_and_refusals_are_clear(gateway: GatewayProcess, tmp_path: Path) -> None:
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
        channel = conn.channel()
        channel.queue_declare("orders", durable=True,
                              arguments={**KEYED, "x-mqgw-partitions": 3})  # fmt: skip
        channel.queue_declare("plain", durable=True)
    path = "/api/queues/%2F/orders/rescale"
    assert gateway.admin("POST", path, {"merge": [0, 2]}) == (
        409, {"error": "conflict", "reason": "partitions 0 and 2 hold ranges that are not "
              "contiguous ([0, 21) and [42, 64)): only adjacent ranges merge"},
    )  # fmt: skip
    status, body = gateway.admin("POST", path, {"split": 7})
    assert (status, body["reason"]) == (409, "unknown partition 7")
    status, body = gateway.admin("POST", path, {"split": 0, "merge": [1, 2]})
    assert status == 400 and "exactly one of" in body["reason"]
    status, body = gateway.admin("POST", path, {"move": 0, "to": "g2"})
    assert status == 400 and "no broker group 'g2' on the embedded node" in body["reason"]
    status, body = gateway.admin("POST", "/api/queues/%2F/plain/rescale", {"split": 0})
    assert status == 400 and "is not a keyed-order queue" in body["reason"]
    status, body = gateway.admin("POST", "/api/queues/%2F/nope/rescale", {"split": 0})
    assert status == 404
    status, _ = gateway.admin("POST", path, {"split": 0}, auth=None)
    assert status == 401
    status, body = gateway.admin("POST", path, {"merge": "1,2", "wait": True})
    assert status == 200 and body["complete"] is True  # empty partitions drain at once
    assert [p["state"] for p in body["route"]["partitions"]] == [
        "open", "removed", "removed", "open"]  # fmt: skip
    status, stats = gateway.admin("GET", "/api/queues/%2F/orders")
    assert (status, stats["messages_ready"]) == (200, 0)  # the unread records count for nothing

    code, _, text = _rescale(gateway, tmp_path, "orders", "--merge", "0,1")
    assert code == 1 and "answered 409 unknown partition" not in text
    assert "partition 1 is removed, not open" in text, text


def test_keyed_arguments_are_checked_at_declare(gateway: GatewayProcess) -> None:
    cases = [
        ({"x-mqgw-ordering": "random"}, "invalid arg 'x-mqgw-ordering'"),
        ({"x-mqgw-ordering": "key", "x-single-active-consumer": True},
         "keyed order needs a classic FIFO queue, not one with x-single-active-consumer"),
        ({"x-mqgw-ordering": "key", "x-mqgw-partitions": 8, "x-mqgw-logical-partitions": 4},
         "4 logical partitions cannot cover 8 partitions"),
        ({"x-mqgw-ordering": "key", "x-mqgw-logical-partitions": 70000},
         "{value_too_large,70000,65536}"),
    ]  # fmt: skip
    for n, (arguments, reason) in enumerate(cases):
        with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
            channel = conn.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
                channel.queue_declare(f"bad{n}", durable=True, arguments=arguments)
            assert closed.value.reply_code == 406
            assert reason in closed.value.reply_text, closed.value.reply_text
