"""The transient write-through in a cluster: on the gateway that delivers a queue, a transient
message for a no-ack consumer of an empty queue goes straight to it, as on the embedded node
(and as RabbitMQ hands it over unwritten): nothing reaches the broker. A consumer on another
gateway still gets everything through the broker."""

from __future__ import annotations

import urllib.parse

import pika

from bench.servers import GatewayServer, check_for
from tests.cluster.conftest import Cluster
from tests.cluster.test_two_gateways import channel


def broker_end(gateway: GatewayServer, queue: str) -> int:
    status, body = gateway.admin("GET", f"/api/queues/%2F/{urllib.parse.quote(queue)}")
    assert status == 200, body
    return sum(p["max_offset"] for p in body["mqgw"]["partition_details"])


def test_transient_no_ack_goes_straight_to_a_local_consumer(cluster: Cluster) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    conn, ch = channel(a)
    ch.queue_declare("live")
    got: list[bytes] = []
    ch.basic_consume("live", lambda _c, _m, _p, body: got.append(body), auto_ack=True)
    check_for(10, lambda: "delivering queue 'live'" in a.log(), interval_s=0.05)
    transient = pika.BasicProperties(delivery_mode=1)

    def probe_goes_straight() -> bool:
        # The take-over's first read may still be out when the log line shows: until it
        # ends, publishes go through the broker. A probe that leaves the end as it was
        # went straight.
        before = broker_end(a, "live")
        ch.basic_publish("", "live", b"probe", transient)
        check_for(5, lambda: (conn.process_data_events(time_limit=0.05), got)[1], interval_s=0)
        got.clear()
        return broker_end(a, "live") == before

    check_for(10, probe_goes_straight, interval_s=0)
    base = broker_end(a, "live")
    for n in range(200):
        ch.basic_publish("", "live", b"%d" % n, transient)

    def all_in() -> bool:
        conn.process_data_events(time_limit=0.05)
        return len(got) == 200

    check_for(10, all_in, interval_s=0)
    assert got == [b"%d" % n for n in range(200)]  # in order, once each
    assert broker_end(a, "live") == base  # nothing was appended
    # Published through the other gateway, they go through the broker and still arrive.
    conn_b, ch_b = channel(b)
    check_for(5, lambda: ch_b.queue_declare("live", passive=True))
    for n in range(200, 250):
        ch_b.basic_publish("", "live", b"%d" % n, transient)
    check_for(10, lambda: (conn.process_data_events(time_limit=0.05), len(got) == 250)[1])
    assert got[200:] == [b"%d" % n for n in range(200, 250)]
    assert broker_end(a, "live") == base + 50
    conn.close()
    conn_b.close()
