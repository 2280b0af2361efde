"""x-max-length-bytes with reject-publish, enforced by the broker: publishers with confirms on
two gateways at once fill the queue to exactly its byte limit and no further (each gateway
alone sees only its own publishes), the overflowing publishes are nacked, and bytes
consumed through one gateway are room again for a publisher on the other."""

from __future__ import annotations

import threading

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from bench.servers import GatewayServer, check_for
from tests.cluster.conftest import Cluster
from tests.cluster.test_two_gateways import channel

LIMIT_BYTES, PER_GATEWAY = 10_000, 150
SIZES = {"a": 150, "b": 50}  # 150 * (150 + 50) bytes offered: three times the limit
QUEUE = "capped-bytes"


def publish(ch: BlockingChannel, body: bytes) -> bool:
    """True when confirmed, False when nacked."""
    try:
        ch.basic_publish("", QUEUE, body)
    except pika.exceptions.NackError:
        return False
    return True


def publish_all(gateway: GatewayServer, tag: str, outcome: dict[str, list[bool]]) -> None:
    conn, ch = channel(gateway)
    ch.confirm_delivery()
    body = tag.encode() * SIZES[tag]
    outcome[tag] = [publish(ch, body) for _ in range(PER_GATEWAY)]
    conn.close()


def ready_count(ch: BlockingChannel) -> int:
    count: int = ch.queue_declare(QUEUE, passive=True).method.message_count
    return count


def test_two_gateways_fill_the_queue_to_its_byte_limit_and_no_further(cluster: Cluster) -> None:
    a, b = cluster.add_gateway("gwA"), cluster.add_gateway("gwB")
    conn_a, ch_a = channel(a)
    arguments = {"x-max-length-bytes": LIMIT_BYTES, "x-overflow": "reject-publish"}
    ch_a.queue_declare(QUEUE, durable=True, arguments=arguments)
    conn_b, ch_b = channel(b)
    check_for(3, lambda: ch_b.queue_declare(QUEUE, passive=True))
    outcome: dict[str, list[bool]] = {}
    threads = [
        threading.Thread(target=publish_all, args=(gateway, tag, outcome))
        for gateway, tag in ((a, "a"), (b, "b"))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    acked = {tag: sum(results) for tag, results in outcome.items()}
    stored_bytes = sum(acked[tag] * SIZES[tag] for tag in acked)
    assert 0 < stored_bytes <= LIMIT_BYTES, acked
    assert acked["a"] and acked["b"]  # both gateways got some in
    assert not outcome["a"][-1] and not outcome["b"][-1]  # and both were nacked at the end
    # Nothing consumed: ready bytes only grew, so they never passed the limit. What room
    # is left (less than a's 150) takes 1-byte messages up to the limit exactly.
    ch_a.confirm_delivery()
    ch_b.confirm_delivery()
    top_up = 0
    while publish(ch_b, b"."):
        top_up += 1
        assert top_up <= SIZES["a"]
    assert stored_bytes + top_up == LIMIT_BYTES
    assert not publish(ch_a, b".")  # full for the other gateway too
    total = acked["a"] + acked["b"] + top_up
    for ch in (ch_a, ch_b):  # the count, from either gateway
        assert ready_count(ch) == total

    # Consumed through gateway A: exactly those bytes are room again on gateway B.
    ch_a.basic_qos(prefetch_count=10)
    consumed = 0
    for got, (method, _props, body) in enumerate(ch_a.consume(QUEUE, inactivity_timeout=5), 1):
        assert method is not None, f"only {got - 1} delivered"
        consumed += len(body)
        ch_a.basic_ack(method.delivery_tag)
        if got == 20:
            break
    ch_a.cancel()
    check_for(10, lambda: ready_count(ch_b) == total - 20)
    assert publish(ch_b, b"r" * consumed)
    assert not publish(ch_b, b".")
    # What the queue holds now is the limit, byte for byte.
    left = 0
    for got, (method, _props, body) in enumerate(ch_b.consume(QUEUE, inactivity_timeout=5), 1):
        assert method is not None, f"only {got - 1} of {total - 19} delivered"
        left += len(body)
        ch_b.basic_ack(method.delivery_tag)
        if got == total - 19:
            break
    ch_b.cancel()
    assert left == LIMIT_BYTES
    conn_a.close()
    conn_b.close()
