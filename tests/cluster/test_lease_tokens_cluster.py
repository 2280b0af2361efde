"""A delivery lease token Redis gave twice, with real processes (nemesis seed 8): gateway
gw-a delivers a queue and is paused; Redis loses the writes of gw-a's take (what a promoted
replica that missed them holds); gw-b takes the lease and gets gw-a's counter value again.
Its token (gw-b's tag is the lower) is below gw-a's at the broker: refused. gw-b gives that
lease up and takes the next one past the broker's counter, and delivers; gw-a, woken, reads
no more. Every message is delivered, and every repeat is flagged redelivered."""

from __future__ import annotations

import re
import signal
from collections import Counter

import pika
import redis

from bench.servers import check_for
from meta.cluster import owner_tag, token_counter
from meta.redis_keys import RedisKeys
from tests.cluster.conftest import Cluster
from tests.cluster.test_two_gateways import channel

QUEUE = "twice"
TOKEN = re.compile(r"delivering queue 'twice' partition 0 \(lease token (\d+)\)")

Deliveries = list[tuple[bytes, bool]]


def _consume(ch: pika.adapters.blocking_connection.BlockingChannel, got: Deliveries) -> None:
    def on_message(
        ch: pika.adapters.blocking_connection.BlockingChannel,
        method: pika.spec.Basic.Deliver,
        _props: pika.BasicProperties,
        body: bytes,
    ) -> None:
        got.append((body, bool(method.redelivered)))
        ch.basic_ack(method.delivery_tag)

    ch.basic_qos(prefetch_count=50)
    ch.basic_consume(QUEUE, on_message)


def _tokens(log: str) -> list[int]:
    return [int(token) for token in TOKEN.findall(log)]


def test_a_token_given_twice_is_refused_then_passed(cluster: Cluster) -> None:
    assert owner_tag("gw-b") < owner_tag("gw-a")  # gw-b's take-over is the refused one
    a, b = cluster.add_gateway("gw-a"), cluster.add_gateway("gw-b")
    conn_a, ch_a = channel(a)
    ch_a.queue_declare(QUEUE, durable=True)
    got_a: Deliveries = []
    _consume(ch_a, got_a)
    check_for(10, lambda: bool(_tokens(a.log())), interval_s=0.1)
    (first,) = _tokens(a.log())
    conn_b, ch_b = channel(b)
    got_b: Deliveries = []
    _consume(ch_b, got_b)
    conn_p, ch_p = channel(b)
    ch_p.confirm_delivery()

    def publish(start: int, count: int) -> None:
        for i in range(start, start + count):
            ch_p.basic_publish("", QUEUE, b"%d" % i, pika.BasicProperties(delivery_mode=2))

    publish(0, 50)
    a.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
    try:
        keys = RedisKeys()
        client = redis.Redis.from_url(cluster.redis.url)
        (lease,) = client.keys(keys.delivery_lease("q:*:0"))  # the one queue's
        client.delete(lease)
        client.set(keys.lease_tokens(), token_counter(first) - 1)
        client.close()
        check_for(15, lambda: bool(_tokens(b.log())), interval_s=0.1)
        assert "fencing token refused" in b.log()  # the value again: below gw-a's token
        (taken,) = _tokens(b.log())
        assert token_counter(taken) == token_counter(first) + 1
        publish(50, 50)

        def drained() -> bool:
            conn_b.process_data_events(time_limit=0.1)
            return len({body for body, _ in got_b} | {body for body, _ in got_a}) >= 100

        check_for(15, drained, interval_s=0)
    finally:
        a.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
    publish(100, 50)
    for _ in range(30):  # both consumers: whatever either still gets
        conn_a.process_data_events(time_limit=0.05)
        conn_b.process_data_events(time_limit=0.05)
    everything = got_a + got_b
    assert {body for body, _ in everything} == {b"%d" % i for i in range(150)}
    times = Counter(body for body, _ in everything)
    flags = Counter(body for body, redelivered in everything if redelivered)
    unflagged = [body for body, n in times.items() if flags[body] < n - 1]
    assert unflagged == []
    for conn in (conn_a, conn_b, conn_p):
        conn.close()
