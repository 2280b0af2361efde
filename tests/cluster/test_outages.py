"""Parts of the cluster going away under load: the broker killed with SIGKILL and restarted
(its crash recovery holds over the remote protocol and the gateway reconnects by itself), and
Redis restarted (traffic on existing topology goes on, declarations fail cleanly meanwhile
and work after). No confirmed message is lost in either."""

from __future__ import annotations

import threading
import time

import pika
import pika.exceptions

from bench.servers import GatewayServer, check_for
from tests.cluster.conftest import Cluster


class Publisher(threading.Thread):
    """Publishes numbered persistent messages with confirms until stopped; a nack or a
    closed connection is retried on a new connection (the message is then unconfirmed)."""

    def __init__(self, gateway: GatewayServer, queue: str) -> None:
        super().__init__(daemon=True)
        self.gateway = gateway
        self.queue = queue
        self.confirmed: list[int] = []
        self.failed = 0
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                conn = pika.BlockingConnection(pika.URLParameters(self.gateway.url))
                ch = conn.channel()
                ch.confirm_delivery()
                while not self.stop.is_set():
                    try:
                        ch.basic_publish("", self.queue, b"%d" % n,
                                         pika.BasicProperties(delivery_mode=2))  # fmt: skip
                        self.confirmed.append(n)
                    except pika.exceptions.NackError:
                        self.failed += 1
                    n += 1
                conn.close()
            except pika.exceptions.AMQPError:
                self.failed += 1
                n += 1
                time.sleep(0.05)


def drain(gateway: GatewayServer, queue: str, want: set[int], timeout_s: float) -> set[int]:
    got: set[int] = set()
    conn = pika.BlockingConnection(pika.URLParameters(gateway.url))
    ch = conn.channel()
    deadline = time.monotonic() + timeout_s
    for method, _props, body in ch.consume(queue, inactivity_timeout=0.5):
        if method is not None:
            got.add(int(body))
            ch.basic_ack(method.delivery_tag)
        if want <= got or time.monotonic() > deadline:
            break
    conn.close()
    return got


def test_broker_killed_and_restarted_under_load(cluster: Cluster) -> None:
    gateway = cluster.add_gateway("gw1")
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
        conn.channel().queue_declare("jobs", durable=True)
    publisher = Publisher(gateway, "jobs")
    publisher.start()
    check_for(10, lambda: len(publisher.confirmed) >= 200)
    cluster.broker.kill()
    down_at = len(publisher.confirmed)
    # Refused, not confirmed: a publish waits up to the store's 10 s for the broker first.
    check_for(20, lambda: publisher.failed > 0)
    assert len(publisher.confirmed) <= down_at + 1
    cluster.broker.start()  # same data, same port: the gateway reconnects by itself
    check_for(20, lambda: len(publisher.confirmed) >= down_at + 200)
    publisher.stop.set()
    publisher.join(10)
    got = drain(gateway, "jobs", set(publisher.confirmed), 30)
    assert set(publisher.confirmed) <= got
    assert "connected to broker" in gateway.log()


def test_redis_restarted_under_load(cluster: Cluster) -> None:
    gateway = cluster.add_gateway("gw1")
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
        conn.channel().queue_declare("steady", durable=True)
    publisher = Publisher(gateway, "steady")
    publisher.start()
    check_for(10, lambda: len(publisher.confirmed) >= 100)
    cluster.redis.stop()
    before = len(publisher.confirmed)
    # Existing topology: publishing goes on while Redis is away.
    check_for(10, lambda: len(publisher.confirmed) >= before + 200)
    # A declaration waits its bound, then fails cleanly on its channel only.
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
        ch = conn.channel()
        started = time.monotonic()
        try:
            ch.queue_declare("new-while-down", durable=True)
            raise AssertionError("declared without Redis")
        except pika.exceptions.ChannelClosedByBroker as closed:
            assert closed.reply_code == 405
            assert "Redis is unreachable" in closed.reply_text
        assert time.monotonic() - started < 15
        assert conn.is_open  # the connection survives: another channel still works
        other = conn.channel()
        other.basic_publish("", "steady", b"-1")
    cluster.redis.start()  # same data (AOF), a new run id: gateways reload
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
        ch = conn.channel()
        check_for(15, lambda: _declares(ch))
    publisher.stop.set()
    publisher.join(10)
    got = drain(gateway, "steady", set(publisher.confirmed), 30)
    assert set(publisher.confirmed) <= got


def _declares(ch: pika.adapters.blocking_connection.BlockingChannel) -> bool:
    try:
        ch.queue_declare("new-after", durable=True)
        return True
    except pika.exceptions.ChannelClosedByBroker:
        return False
