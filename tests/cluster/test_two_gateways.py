"""Two gateways over one Redis and one broker, as `mqgw serve --meta` runs them: what one
declares, deletes or permits the other follows; messages published on one are consumed on
the other; one gateway delivers a queue at a time, and when it is killed the other takes
over with nothing confirmed lost and repeats flagged redelivered."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

import pika
import pika.exceptions

from bench.servers import GatewayServer, check_for
from tests.cluster.conftest import Cluster


def channel(gateway: GatewayServer, user: str = "guest", password: str = "guest") -> tuple[
    pika.BlockingConnection, pika.adapters.blocking_connection.BlockingChannel
]:  # fmt: skip
    params = pika.URLParameters(gateway.url)
    params.credentials = pika.PlainCredentials(user, password)
    conn = pika.BlockingConnection(params)
    return conn, conn.channel()


def exists(gateway: GatewayServer, queue: str) -> bool:
    conn, ch = channel(gateway)
    try:
        ch.queue_declare(queue, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker as closed:
        assert closed.reply_code == 404
        return False
    finally:
        if conn.is_open:
            conn.close()


def test_declare_on_one_publish_on_the_other_consume_and_count_on_both(
    cluster: Cluster,
) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    conn_a, ch_a = channel(a)
    ch_a.queue_declare("orders", durable=True)
    ch_a.exchange_declare("shop", "topic", durable=True)
    ch_a.queue_bind("orders", "shop", "order.*")
    conn_b, ch_b = channel(b)
    ch_b.confirm_delivery()
    # B follows A's declarations through the change feed.
    check_for(2, lambda: exists(b, "orders"))
    deadline = time.monotonic() + 2
    while True:  # the binding may trail the queue by a few milliseconds
        try:
            ch_b.basic_publish("shop", "order.new", b"first", mandatory=True)
            break
        except pika.exceptions.UnroutableError:
            assert time.monotonic() < deadline, "B never routed to A's binding"
    for i in range(1, 100):
        ch_b.basic_publish("shop", "order.new", b"%d" % i)
    # Both gateways answer the same count: from the broker, not their own memory.
    assert ch_a.queue_declare("orders", passive=True).method.message_count == 100
    assert ch_b.queue_declare("orders", passive=True).method.message_count == 100
    got = []
    for method, _props, body in ch_a.consume("orders", inactivity_timeout=5):
        assert method is not None, f"only {len(got)} delivered"
        got.append(body)
        ch_a.basic_ack(method.delivery_tag)
        if len(got) == 100:
            break
    assert got == [b"first"] + [b"%d" % i for i in range(1, 100)]  # FIFO across gateways
    ch_a.cancel()
    check_for(3, lambda: ch_b.queue_declare("orders", passive=True).method.message_count == 0)
    conn_a.close()
    conn_b.close()


def test_a_queue_deleted_on_one_gateway_is_gone_on_the_other_within_a_second(
    cluster: Cluster,
) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    conn_a, ch_a = channel(a)
    ch_a.queue_declare("temp", durable=True)
    check_for(2, lambda: exists(b, "temp"))
    conn_b, ch_b = channel(b)
    ch_b.queue_delete("temp")
    deleted = time.monotonic()
    check_for(1, lambda: not exists(a, "temp"))
    assert time.monotonic() - deleted < 1.0
    conn_a.close()
    conn_b.close()


def test_users_and_permissions_changed_on_one_apply_on_the_other(cluster: Cluster) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    status, _ = a.admin("PUT", "/api/users/ann", {"password": "s3cret", "tags": ""})
    assert status in (201, 204)
    status, _ = a.admin(
        "PUT", "/api/permissions/%2F/ann", {"configure": ".*", "write": ".*", "read": ".*"}
    )
    assert status in (201, 204)
    conn, ch = channel(b, "ann", "s3cret")  # B knows the user and her permission
    ch.queue_declare("anns", durable=False)
    # Read taken away on A: B refuses her a consume from then on.
    status, _ = a.admin(
        "PUT", "/api/permissions/%2F/ann", {"configure": ".*", "write": ".*", "read": "^$"}
    )
    assert status in (201, 204)

    def refused() -> bool:
        probe_conn, probe = channel(b, "ann", "s3cret")
        try:
            probe.basic_get("anns")
            return False
        except pika.exceptions.ChannelClosedByBroker as closed:
            assert closed.reply_code == 403
            return True
        finally:
            if probe_conn.is_open:
                probe_conn.close()

    check_for(2, refused)
    conn.close()


class Consumer(threading.Thread):
    """Acks everything from ``queue`` until the gateway goes away or ``stop`` is set."""

    def __init__(self, gateway: GatewayServer, queue: str) -> None:
        super().__init__(daemon=True)
        self.gateway = gateway
        self.queue = queue
        self.seen: list[tuple[int, int, bool]] = []  # (when, message, redelivered)
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            conn, ch = channel(self.gateway)
            ch.basic_qos(prefetch_count=20)
            for method, _props, body in ch.consume(self.queue, inactivity_timeout=0.2):
                if self.stop.is_set():
                    break
                if method is None:
                    continue
                self.seen.append((time.monotonic_ns(), int(body), bool(method.redelivered)))
                ch.basic_ack(method.delivery_tag)
            conn.close()
        except (pika.exceptions.AMQPError, OSError):
            return


def test_killing_the_delivering_gateway_loses_nothing_confirmed(cluster: Cluster) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    conn, ch = channel(b)
    ch.queue_declare("work", durable=True)
    ch.confirm_delivery()
    check_for(2, lambda: exists(a, "work"))
    consumers = [Consumer(a, "work"), Consumer(b, "work")]
    for consumer in consumers:
        consumer.start()
    # Whichever gateway took the lease delivers; kill that one under load.
    holder: Callable[[], GatewayServer | None] = lambda: next(  # noqa: E731
        (g for g in (a, b) if "delivering queue 'work'" in g.log()), None
    )
    confirmed = []
    for i in range(300):
        ch.basic_publish("", "work", b"%d" % i, pika.BasicProperties(delivery_mode=2))
        confirmed.append(i)
    delivering = check_for(5, holder)
    other = b if delivering is a else a
    check_for(10, lambda: sum(len(c.seen) for c in consumers) >= 50)
    # One gateway at a time: only the lease holder's consumer got anything so far.
    assert [bool(c.seen) for c in consumers] == [delivering is a, delivering is b]
    assert delivering.stop(signal.SIGKILL) == -signal.SIGKILL
    if delivering is b:  # the publisher was connected to B: go on through A
        conn, ch = channel(a)
        ch.confirm_delivery()
    for i in range(300, 600):
        ch.basic_publish("", "work", b"%d" % i, pika.BasicProperties(delivery_mode=2))
        confirmed.append(i)
    # The survivor takes the lease once the dead one's lapses (5 s), then drains the rest.
    seen = lambda: {n for c in consumers for _, n, _ in c.seen}  # noqa: E731
    check_for(30, lambda: seen() >= set(confirmed))
    for consumer in consumers:
        consumer.stop.set()
    first: set[int] = set()
    for _, n, redelivered in sorted(s for c in consumers for s in c.seen):
        assert n not in first or redelivered, f"message {n} delivered twice without the flag"
        first.add(n)
    assert "delivering queue 'work'" in other.log()
    conn.close()


def test_a_dead_gateways_exclusive_queues_are_reaped(cluster: Cluster) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    _conn, ch = channel(a)
    ch.queue_declare("mine", exclusive=True)
    check_for(10, lambda: "mine" in queue_names(b))
    assert a.stop(signal.SIGKILL) == -signal.SIGKILL
    check_for(30, lambda: "mine" not in queue_names(b))  # lease lapse (5 s) + reap
    # Whichever live gateway reaps it says so (the cluster's first two are live too).
    reaped = "gateway gwA lapsed: 1 exclusive queue(s) deleted"
    assert any(reaped in g.log() for g in cluster.gateways if g is not a)


def queue_names(gateway: GatewayServer) -> set[str]:
    status, body = gateway.admin("GET", "/api/queues")
    assert status == 200
    return {q["name"] for q in body}


def test_basic_get_on_a_gateway_that_did_not_declare_or_publish(cluster: Cluster) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    conn_a, ch_a = channel(a)
    ch_a.queue_declare("polled", durable=True)
    ch_a.confirm_delivery()
    for i in range(5):
        ch_a.basic_publish("", "polled", b"%d" % i)
    check_for(2, lambda: exists(b, "polled"))
    conn_b, ch_b = channel(b)
    got = []
    for _ in range(5):
        method, _props, body = ch_b.basic_get("polled")
        assert method is not None
        got.append(body)
        ch_b.basic_ack(method.delivery_tag)
    assert got == [b"0", b"1", b"2", b"3", b"4"]
    assert ch_b.basic_get("polled") == (None, None, None)
    check_for(3, lambda: ch_a.queue_declare("polled", passive=True).method.message_count == 0)
    conn_a.close()
    conn_b.close()
