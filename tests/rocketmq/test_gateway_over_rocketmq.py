"""Unchanged AMQP clients through `mqgw serve --store rocketmq://...` over a real RocketMQ:
messages live in RocketMQ topics, one per queue, and survive the gateway (kill -9 included);
two gateways sharing Redis serve one queue from the same topic without duplicates."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import pika
import pytest

from bench.servers import GatewayServer, free_port
from storage.rocketmq import connect_rocketmq_store
from tests.harness.redis_server import RedisServer
from tests.harness.rocketmq import LocalRocketMQ
from tests.harness.waiting import check_for


def _store_url(rocketmq: LocalRocketMQ) -> str:
    return f"rocketmq://{rocketmq.namesrv}/gw{uuid.uuid4().hex[:10]}"


def _topics(url: str) -> dict[int, int]:
    async def ask() -> dict[int, int]:
        async with connect_rocketmq_store(url, 1 << 20) as store:
            return await store.queues()

    return anyio.run(ask)


def _committed(url: str) -> list[tuple[int, int]]:
    """(committed offset, end) of each one-partition queue, as RocketMQ holds them."""

    async def ask() -> list[tuple[int, int]]:
        async with connect_rocketmq_store(url, 1 << 20) as store:
            found = []
            for queue_id, partitions in (await store.queues()).items():
                if partitions == 1:
                    part = (await store.queue_stats(queue_id)).partitions[0]
                    found.append((part.committed, part.max_offset))
            return sorted(found)

    return anyio.run(ask)


@pytest.fixture
def gateway_on_rocketmq(tmp_path: Path, rocketmq: LocalRocketMQ) -> Iterator[GatewayServer]:
    gateway = GatewayServer(tmp_path / "gw", ["--store", _store_url(rocketmq)]).start()
    yield gateway
    gateway.kill()
    print(f"--- gateway log tail ---\n{gateway.log()[-4000:]}")


def _publish(url: str, queue: str, bodies: list[bytes], exchange: str = "") -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    if not exchange:
        channel.queue_declare(queue, durable=True)  # as applications do, on every gateway
    channel.confirm_delivery()
    for body in bodies:
        props = pika.BasicProperties(delivery_mode=2, headers={"n": body.decode()})
        channel.basic_publish(exchange, queue, body, props)
    connection.close()


def test_messages_live_in_rocketmq_and_survive_a_killed_gateway(
    gateway_on_rocketmq: GatewayServer,
) -> None:
    gateway = gateway_on_rocketmq
    connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
    channel = connection.channel()
    channel.queue_declare("orders", durable=True)
    channel.exchange_declare("events", "fanout", durable=True)
    for queue in ("audit", "billing"):
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, "events")
    connection.close()
    _publish(gateway.url, "orders", [b"%d" % n for n in range(300)])
    _publish(gateway.url, "", [b"e%d" % n for n in range(20)], exchange="events")
    store_url = gateway.args[1]
    # A topic per queue in RocketMQ (and one for the gateway's own timer queue, 32 partitions).
    assert sorted(_topics(store_url).values()) == [1, 1, 1, 32]

    connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
    channel = connection.channel()
    acked = []
    for method, props, body in channel.consume("orders", inactivity_timeout=10):
        assert method is not None, "no message within 10 s"
        assert props.headers == {"n": body.decode()}  # AMQP properties kept whole
        channel.basic_ack(method.delivery_tag)
        acked.append(int(body))
        if len(acked) == 100:
            break
    channel.cancel()
    assert acked == list(range(100))
    connection.close()
    # The gateway commits acks every second, as consumer offsets in RocketMQ.
    check_for(10, lambda: (100, 300) in _committed(store_url), what="offsets committed")
    gateway.kill()  # kill -9: nothing of the messages was on the gateway's disk
    gateway.start()
    connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
    channel = connection.channel()
    assert channel.queue_declare("orders", passive=True).method.message_count == 200
    rest = []
    for method, _props, body in channel.consume("orders", inactivity_timeout=10):
        assert method is not None, f"stalled after {len(rest)} messages"
        channel.basic_ack(method.delivery_tag)
        rest.append(int(body))
        if len(rest) == 200:
            break
    channel.cancel()
    assert rest == list(range(100, 300))  # nothing lost, in order, nothing acked came back
    for queue in ("audit", "billing"):  # one publish, every bound queue
        got = [channel.basic_get(queue, auto_ack=True)[2] for _ in range(20)]
        assert got == [b"e%d" % n for n in range(20)]
        assert channel.basic_get(queue)[0] is None
    _publish(gateway.url, "orders", [b"x", b"y"])
    assert channel.queue_purge("orders").method.message_count == 2
    assert channel.basic_get("orders")[0] is None
    channel.queue_delete("billing")
    connection.close()
    assert sorted(_topics(store_url).values()) == [1, 1, 32]  # its topic deleted in RocketMQ


@pytest.mark.slow
def test_two_gateways_share_a_queue_without_duplicates(
    tmp_path: Path, rocketmq: LocalRocketMQ
) -> None:
    redis = RedisServer(tmp_path / "redis").start()
    store = _store_url(rocketmq)
    gateways = [
        GatewayServer(tmp_path / name, ["--store", store, "--meta", redis.url, "--node-name",
                                        name, "--admin-port", str(free_port())]).start()
        for name in ("gw1", "gw2")
    ]  # fmt: skip
    try:
        connection = pika.BlockingConnection(pika.URLParameters(gateways[0].url))
        channel = connection.channel()
        channel.queue_declare("shared", durable=True)
        count = 2000
        seen: dict[int, int] = {}
        lock = threading.Lock()

        def consume(url: str) -> None:
            conn = pika.BlockingConnection(pika.URLParameters(url))
            ch = conn.channel()
            ch.queue_declare("shared", durable=True)  # as applications do, on every gateway
            ch.basic_qos(prefetch_count=50)
            for method, _props, body in ch.consume("shared", inactivity_timeout=5):
                if method is None:
                    break
                with lock:
                    seen[int(body)] = seen.get(int(body), 0) + 1
                ch.basic_ack(method.delivery_tag)
            conn.close()

        consumers = [threading.Thread(target=consume, args=(g.url,)) for g in gateways]
        for thread in consumers:
            thread.start()
        halves = [[b"%d" % n for n in range(i, count, 2)] for i in (0, 1)]
        publishers = [
            threading.Thread(target=_publish, args=(g.url, "shared", half))
            for g, half in zip(gateways, halves, strict=True)
        ]
        for thread in publishers:
            thread.start()
        for thread in [*publishers, *consumers]:
            thread.join(120)
        assert sorted(seen) == list(range(count))
        assert {n: c for n, c in seen.items() if c > 1} == {}
        assert channel.queue_declare("shared", passive=True).method.message_count == 0
        connection.close()
    finally:
        for gateway in gateways:
            gateway.kill()
            print(f"--- {gateway.data_dir.name} log tail ---\n{gateway.log()[-4000:]}")
        redis.stop()


def test_a_broker_that_does_not_answer_at_start_is_one_line(
    tmp_path: Path, rocketmq: LocalRocketMQ
) -> None:
    """The name server answers but the broker is stopped (SIGSTOP): `mqgw serve` gives up
    within its call timeout with one line and exit status 1, never a traceback."""
    (broker,) = [b for b in rocketmq.brokers if b.pid is not None]
    assert broker.pid is not None
    os.kill(broker.pid, signal.SIGSTOP)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "mqgw_cli.main", "serve", "--host", "127.0.0.1",
             "--amqp-port", "0", "--admin-port", "0", "--data-dir", str(tmp_path / "gw"),
             "--store", _store_url(rocketmq)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.kill(broker.pid, signal.SIGCONT)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("mqgw serve: RocketMQ store rocketmq://"), line
    assert line.endswith(f"rocketmq {broker.address}: no answer in 5.0 s"), line


def test_with_shared_metadata_no_change_closes_a_partition(
    tmp_path: Path, rocketmq: LocalRocketMQ
) -> None:
    """RocketMQ does not refuse a write after a partition's closing record, so with Redis
    (several gateways may write) shrink, split, merge and move answer 409 with the reason;
    growing closes nothing and goes ahead."""
    redis = RedisServer(tmp_path / "redis").start()
    args = ["--store", _store_url(rocketmq), "--meta", redis.url, "--admin-port", str(free_port())]
    gateway = GatewayServer(tmp_path / "gw", args)
    try:
        gateway.start()
        connection = pika.BlockingConnection(pika.URLParameters(gateway.url))
        channel = connection.channel()
        channel.queue_declare("plain", durable=True)
        channel.queue_declare("keyed", durable=True, arguments={"x-mqgw-ordering": "key"})
        connection.close()
        grow = {"partitions": 2, "wait": True}  # open once read (5 s: nobody delivers it)
        grown, answer = gateway.admin("POST", "/api/queues/%2F/plain/scale", grow)
        assert grown == 200 and answer["complete"], answer
        for path, body in [("plain/scale", {"partitions": 1}),
                           ("keyed/rescale", {"partitions": 2}),
                           ("keyed/rescale", {"split": 0})]:  # fmt: skip
            status, answer = gateway.admin("POST", f"/api/queues/%2F/{path}", body)
            assert status == 409, (path, body, answer)
            assert "refused over RocketMQ with shared metadata" in answer["reason"], answer
        status, route = gateway.admin("GET", "/api/queues/%2F/plain/route")
        assert status == 200 and len(route["partitions"]) == 2  # the shrink wrote nothing
        assert [p["state"] for p in route["partitions"]] == ["open", "open"], route
    finally:
        gateway.kill()
        redis.stop()
