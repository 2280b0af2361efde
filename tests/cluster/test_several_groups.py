"""A cluster with two unreplicated broker groups (g1, g2) and two gateways: queues are placed
over both groups by the route table in Redis, a fanout reaches queues on both, counts, purge
and TTL hold from either gateway, and a broker killed with SIGKILL and restarted loses
nothing confirmed while the gateways reconnect by themselves."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pika
import pika.exceptions

from bench.servers import BrokerServer, GatewayServer, check_for, free_port
from tests.cluster.conftest import GROUPS, Channel, TwoGroups, connect, count
from tests.harness.redis_server import RedisServer


def consume_all(ch: Channel, queues: list[str], want: int, timeout_s: float) -> list[tuple]:
    """(queue, body, redelivered) of every delivery until ``want`` came (acked each)."""
    got: list[tuple[str, bytes, bool]] = []

    def on_message(ch: Channel, method: pika.spec.Basic.Deliver, _p: object, body: bytes) -> None:
        got.append((method.consumer_tag, body, bool(method.redelivered)))
        ch.basic_ack(method.delivery_tag)

    tags = {ch.basic_consume(q, on_message, consumer_tag=f"c-{q}"): q for q in queues}
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        ch.connection.process_data_events(time_limit=0.1)
    ch.connection.process_data_events(time_limit=0.3)  # anything beyond ``want``: a duplicate
    for tag in tags:
        ch.basic_cancel(tag)
    return got


def test_queues_spread_over_two_groups_with_fanout_counts_purge_and_ttl(
    two_groups: TwoGroups,
) -> None:
    a, b = two_groups.gateways
    conn_a, ch_a = connect(a)
    queues = [f"q{i:02d}" for i in range(20)]
    ch_a.exchange_declare("fan", "fanout", durable=True)
    for queue in queues:
        ch_a.queue_declare(queue, durable=True)
        ch_a.queue_bind(queue, "fan")
    # The route table: each queue on one group, spread evenly (fewest partitions first).
    routes = {q: two_groups.route(q) for q in queues}
    assert Counter(tuple(r or ()) for r in routes.values()) == {("g1",): 10, ("g2",): 10}
    # And the brokers hold exactly the queues placed on them.
    held = {g: two_groups.broker_queues(g) for g in GROUPS}
    assert len(held["g1"]) >= 10 and len(held["g2"]) >= 10  # (+ a gateway's timer queue)
    assert not set(held["g1"]) & set(held["g2"])

    conn_b, ch_b = connect(b)
    ch_b.confirm_delivery()
    check_for(3, lambda: all(count(ch_b, q) == 0 for q in queues))  # B knows them all
    for i in range(20):  # every fanout message goes to both groups: a split batch
        ch_b.basic_publish("fan", "", b"fan-%d" % i, pika.BasicProperties(delivery_mode=2))
    for queue in queues:
        for i in range(30):
            ch_b.basic_publish("", queue, b"%s-%d" % (queue.encode(), i))
    for ch in (ch_a, ch_b):  # counts from the brokers' offsets, the same on either gateway
        assert {q: count(ch, q) for q in queues} == dict.fromkeys(queues, 50)

    got = consume_all(ch_a, queues, 20 * 50, 30)
    per_queue = Counter(tag.removeprefix("c-") for tag, _, _ in got)
    assert per_queue == dict.fromkeys(queues, 50)
    bodies = Counter((tag, body) for tag, body, _ in got)
    # Exactly once, and none flagged redelivered: no gateway had delivered from these queues
    # before A took their delivery leases (docs/cluster.md, what a new holder flags).
    assert max(bodies.values()) == 1
    assert not any(redelivered for _, _, redelivered in got)
    for queue in queues:
        mine = [body for tag, body, _ in got if tag == f"c-{queue}"]
        assert [m for m in mine if m.startswith(b"fan-")] == [b"fan-%d" % i for i in range(20)]
        assert [m for m in mine if not m.startswith(b"fan-")] == [
            b"%s-%d" % (queue.encode(), i) for i in range(30)
        ]
    check_for(5, lambda: all(count(ch_b, q) == 0 for q in queues))

    # Purge a queue on each group from B; A sees the counts.
    on_g1 = next(q for q in queues if routes[q] == ["g1"])
    on_g2 = next(q for q in queues if routes[q] == ["g2"])
    for i in range(7):
        ch_b.basic_publish("fan", "", b"again-%d" % i)
    assert ch_b.queue_purge(on_g1).method.message_count == 7
    assert ch_b.queue_purge(on_g2).method.message_count == 7
    # (A may still deliver the queues: it reads what B published within its 50 ms poll.)
    expected = {q: 0 if q in (on_g1, on_g2) else 7 for q in queues}
    check_for(3, lambda: {q: count(ch_a, q) for q in queues} == expected)

    # TTL on a queue of each group: expired messages leave the counts on both gateways.
    ttl_queues = ["ttl-1", "ttl-2"]
    for queue in ttl_queues:
        ch_a.queue_declare(queue, durable=True, arguments={"x-message-ttl": 1500})
    assert {tuple(two_groups.route(q) or ()) for q in ttl_queues} == {("g1",), ("g2",)}
    for queue in ttl_queues:
        for i in range(5):
            ch_b.basic_publish("", queue, b"short-%d" % i)
    assert [count(ch_a, q) for q in ttl_queues] == [5, 5]
    time.sleep(1.6)  # past the TTL: nothing can be delivered any more
    assert [ch_a.basic_get(q, auto_ack=True)[0] for q in ttl_queues] == [None, None]
    check_for(5, lambda: [count(ch_b, q) for q in ttl_queues] == [0, 0])

    # Delete: the route goes, the owning broker forgets the queue (and nothing else).
    before = two_groups.broker_queues("g2")
    ch_b.queue_delete(on_g2)
    assert two_groups.route(on_g2) is None
    after = two_groups.broker_queues("g2")
    assert len(before) - len(after) == 1 and set(after) < set(before), (before, after)
    conn_a.close()
    conn_b.close()


class FanoutPublisher(threading.Thread):
    """Numbered persistent messages to a fanout exchange with confirms; a nack or a lost
    connection leaves that number unconfirmed and goes on."""

    def __init__(self, gateway: GatewayServer) -> None:
        super().__init__(daemon=True)
        self.gateway = gateway
        self.confirmed: list[int] = []
        self.failed = 0
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                conn, ch = connect(self.gateway)
                ch.confirm_delivery()
                while not self.stop.is_set():
                    try:
                        ch.basic_publish(
                            "spread", "", b"%d" % n, pika.BasicProperties(delivery_mode=2)
                        )
                        self.confirmed.append(n)
                    except pika.exceptions.NackError:
                        self.failed += 1
                    n += 1
                conn.close()
            except pika.exceptions.AMQPError:
                self.failed += 1
                n += 1
                time.sleep(0.05)


def test_a_broker_killed_and_restarted_loses_nothing_confirmed(two_groups: TwoGroups) -> None:
    a, b = two_groups.gateways
    conn_a, ch_a = connect(a)
    ch_a.exchange_declare("spread", "fanout", durable=True)
    queues = [f"s{i}" for i in range(4)]
    for queue in queues:
        ch_a.queue_declare(queue, durable=True)
        ch_a.queue_bind(queue, "spread")
    assert sorted(str(two_groups.route(q)) for q in queues) == sorted(
        ["['g1']", "['g1']", "['g2']", "['g2']"]
    )
    publisher = FanoutPublisher(b)
    publisher.start()
    try:
        check_for(15, lambda: len(publisher.confirmed) >= 200)
        two_groups.brokers["g2"].kill()
        down_at = len(publisher.confirmed)
        # Refused while a part cannot be stored: the gateway waits up to 10 s for an
        # unreplicated broker to come back before it nacks (gateway/cluster/link.py).
        check_for(30, lambda: publisher.failed > 0)
        assert len(publisher.confirmed) <= down_at + 1
        two_groups.brokers["g2"].start()  # same data, same port
        check_for(20, lambda: len(publisher.confirmed) >= down_at + 200)
    finally:
        publisher.stop.set()
        publisher.join(10)
    confirmed = set(publisher.confirmed)
    got = consume_all(ch_a, queues, len(confirmed) * len(queues), 40)
    for queue in queues:
        numbers = [int(body) for tag, body, _ in got if tag == f"c-{queue}"]
        assert confirmed <= set(numbers), f"{queue}: {len(confirmed - set(numbers))} lost"
        repeats = [n for n, k in Counter(numbers).items() if k > 1]
        assert not repeats, f"{queue}: delivered twice: {repeats[:5]}"
    for gateway in (a, b):
        assert "connected to broker" in gateway.log()
    conn_a.close()


def test_queues_from_a_one_group_cluster_stay_where_their_messages_are(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis").start()
    brokers = {
        g: BrokerServer(tmp_path / g, free_port(), tmp_path / f"{g}.log", g, "0", meta=server.url)
        for g in GROUPS
    }
    made = TwoGroups(server, brokers)
    args = ["--meta", server.url, "--node-name", "gw", "--admin-port", str(free_port())]
    try:
        brokers["g1"].start()
        gateway = GatewayServer(tmp_path / "gw", args).start()
        made.gateways.append(gateway)
        conn, ch = connect(gateway)
        ch.confirm_delivery()
        for queue in ("old-1", "old-2"):
            ch.queue_declare(queue, durable=True)
            for i in range(5):
                ch.basic_publish("", queue, b"%d" % i, pika.BasicProperties(delivery_mode=2))
        conn.close()
        assert made.route("old-1") == ["g1"]  # placed on the one group there is
        gateway.kill()
        brokers["g2"].start()  # a second group, then the gateway again
        gateway.start()
        conn, ch = connect(gateway)
        assert [made.route(q) for q in ("old-1", "old-2")] == [["g1"], ["g1"]]
        for queue in ("new-1", "new-2"):  # g2 holds nothing: new queues go there first
            ch.queue_declare(queue, durable=True)
        assert [made.route(q) for q in ("new-1", "new-2")] == [["g2"], ["g2"]]
        for queue in ("old-1", "old-2"):
            assert count(ch, queue) == 5
            got = [ch.basic_get(queue, auto_ack=True)[2] for _ in range(5)]
            assert got == [b"%d" % i for i in range(5)]
        conn.close()
    finally:
        for gateway in made.gateways:
            gateway.kill()
        for broker in brokers.values():
            broker.kill()
        server.stop()
