"""x-max-length with reject-publish, enforced by the broker: publishers on two gateways at
once cannot overshoot a limit that each gateway would check only against its own view."""

from __future__ import annotations

import threading

import pika
import pika.exceptions

from bench.servers import GatewayServer, check_for
from tests.cluster.conftest import Cluster
from tests.cluster.test_two_gateways import channel

LIMIT, PER_GATEWAY = 100, 500


def publish_all(gateway: GatewayServer, tag: str, outcome: dict[str, list[int]]) -> None:
    conn, ch = channel(gateway)
    ch.confirm_delivery()
    acked, nacked = outcome.setdefault(tag + "/ack", []), outcome.setdefault(tag + "/nack", [])
    for i in range(PER_GATEWAY):
        try:
            ch.basic_publish("", "capped", b"%s-%d" % (tag.encode(), i))
            acked.append(i)
        except pika.exceptions.NackError:
            nacked.append(i)
    conn.close()


def test_two_gateways_publishing_never_pass_the_limit(cluster: Cluster) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    conn_a, ch_a = channel(a)
    arguments = {"x-max-length": LIMIT, "x-overflow": "reject-publish"}
    ch_a.queue_declare("capped", durable=True, arguments=arguments)
    conn_b, ch_b = channel(b)
    check_for(3, lambda: ch_b.queue_declare("capped", passive=True))
    outcome: dict[str, list[int]] = {}
    threads = [
        threading.Thread(target=publish_all, args=(gateway, tag, outcome))
        for gateway, tag in ((a, "a"), (b, "b"))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    acked = len(outcome["a/ack"]) + len(outcome["b/ack"])
    nacked = len(outcome["a/nack"]) + len(outcome["b/nack"])
    assert (acked, nacked) == (LIMIT, 2 * PER_GATEWAY - LIMIT)
    assert outcome["a/ack"] and outcome["b/ack"]  # both gateways got some in
    for ch in (ch_a, ch_b):  # the count, from either gateway
        assert ch.queue_declare("capped", passive=True).method.message_count == LIMIT
    # Consumed, there is room again: the broker counts from the committed offset.
    for got, (method, _props, _body) in enumerate(ch_a.consume("capped", inactivity_timeout=5), 1):
        assert method is not None, f"only {got - 1} delivered"
        ch_a.basic_ack(method.delivery_tag)
        if got == LIMIT:
            break
    ch_a.cancel()
    check_for(5, lambda: ch_b.queue_declare("capped", passive=True).method.message_count == 0)
    outcome.clear()
    publish_all(b, "b", outcome)
    assert len(outcome["b/ack"]) == LIMIT
    conn_a.close()
    conn_b.close()
