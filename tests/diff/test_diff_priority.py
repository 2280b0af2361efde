"""Priority queues (x-max-priority) compared with RabbitMQ 3.10: declare-time validation,
delivery order for basic.get and consumers, the cap at the maximum, requeue, TTL expiry,
max-length drop-head (RabbitMQ drops the head of the *highest* priority), dead letters
arriving in a priority queue, and seeded random sequences of publish/get/ack/nack/reject.

RabbitMQ settles nack/reject through a delegate process, so after a requeue the scenarios wait
for the queue's count to show it before the next basic.get (both servers do the same steps).
"""

from __future__ import annotations

import random
import time
from typing import Any

import pika
import pytest

from tests.diff.support import Server, declare_outcomes, drain_get, run_both
from tests.harness.processes import check_for

QUIET_S = 0.3


def _channel(server: Server) -> tuple[Any, Any]:
    conn = server.pika()
    ch = conn.channel()
    ch.confirm_delivery()
    return conn, ch


def _publish(ch: Any, queue: str, body: str, priority: int | None, **props: Any) -> None:
    properties = pika.BasicProperties(priority=priority, **props)
    ch.basic_publish("", queue, body.encode(), properties)


def _ready(ch: Any, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


def _wait_ready(ch: Any, queue: str, count: int) -> None:
    check_for(5, lambda: _ready(ch, queue) == count or None, interval_s=0.02)


BAD_ARGUMENTS = [
    {"x-max-priority": "high"},
    {"x-max-priority": 256},
    {"x-max-priority": -1},
    {"x-max-priority": 1.5},
    {"x-max-priority": True},
    {"x-max-priority": "a", "x-max-length": -1},  # x-max-length is checked first
    {"x-max-priority": 5, "x-single-active-consumer": "x"},
    {"x-queue-type": "quorum", "x-max-priority": 5},
    {"x-queue-type": "quorum", "x-max-priority": "high"},  # not validated for quorum queues
    {"x-queue-type": "quorum", "x-max-priority": 5, "x-max-length": -1},
    {"x-queue-type": "stream", "x-max-priority": 5},
    {"x-single-active-consumer": "true"},
    {"x-single-active-consumer": 1},
    {"x-queue-type": "quorum", "x-single-active-consumer": 1},
    {"x-queue-type": "stream", "x-single-active-consumer": True},
]
GOOD_ARGUMENTS = [
    {"x-max-priority": 0},
    {"x-max-priority": 1},
    {"x-max-priority": 255},
    {"x-single-active-consumer": True},
    {"x-single-active-consumer": False},
]


def test_declare_arguments_like_rabbitmq(servers: list[Server], names: str) -> None:
    def scenario(server: Server, p: str) -> Any:
        tables = BAD_ARGUMENTS + GOOD_ARGUMENTS
        return declare_outcomes(server, p, tables, durable=_replicated)

    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit
    assert rabbit[0][2].endswith('"expected integer, got longstr"')  # the case


def _replicated(arguments: dict[str, Any]) -> bool:
    """Quorum and stream queues must be durable."""
    return arguments.get("x-queue-type") in ("quorum", "stream")


def _get_order(server: Server, p: str) -> Any:
    """No priority is 0; above the maximum counts as the maximum; FIFO within a level."""
    conn, ch = _channel(server)
    ch.queue_declare(f"{p}-q", arguments={"x-max-priority": 5})
    for body, priority in [
        ("a-none", None),
        ("b-0", 0),
        ("c-5", 5),
        ("d-3", 3),
        ("e-9", 9),
        ("f-200", 200),
        ("g-3", 3),
        ("h-none", None),
    ]:
        _publish(ch, f"{p}-q", body, priority)
    counts = _ready(ch, f"{p}-q")
    got = drain_get(ch, f"{p}-q")
    # x-max-priority 0: one level, so FIFO whatever the messages say.
    ch.queue_declare(f"{p}-z", arguments={"x-max-priority": 0})
    for body, priority in [("a", 3), ("b", None), ("c", 9)]:
        _publish(ch, f"{p}-z", body, priority)
    flat = drain_get(ch, f"{p}-z")
    conn.close()
    return counts, got, flat


def _requeue_keeps_place(server: Server, p: str) -> Any:
    conn, ch = _channel(server)
    ch.queue_declare(f"{p}-q", arguments={"x-max-priority": 5})
    for body, priority in [("a1", 1), ("b1", 1), ("c3", 3), ("d3", 3), ("e0", 0)]:
        _publish(ch, f"{p}-q", body, priority)
    held = [ch.basic_get(f"{p}-q") for _ in range(3)]
    ch.basic_nack(held[0][0].delivery_tag, requeue=True)
    ch.basic_nack(held[2][0].delivery_tag, requeue=True)
    _wait_ready(ch, f"{p}-q", 4)
    _publish(ch, f"{p}-q", "f3", 3)
    got = [m[2] for m in held], drain_get(ch, f"{p}-q")
    ch.basic_ack(held[1][0].delivery_tag)
    conn.close()
    return got


def _consumer_order(server: Server, p: str) -> Any:
    """A consumer with prefetch 1: the first message goes out at once (the queue was empty);
    what arrives meanwhile waits, and each ack brings the highest priority next."""
    conn, ch = _channel(server)
    ch.queue_declare(f"{p}-q", arguments={"x-max-priority": 10})
    ch.basic_qos(prefetch_count=1)
    received: list[tuple[bytes, bool]] = []
    tags: list[int] = []

    def on_message(channel: Any, method: Any, _props: Any, body: bytes) -> None:
        received.append((body, method.redelivered))
        tags.append(method.delivery_tag)

    ch.basic_consume(f"{p}-q", on_message)
    pub_conn, pub = _channel(server)
    _publish(pub, f"{p}-q", "first-0", 0)
    check_for(5, lambda: (conn.process_data_events(0.01), len(received) == 1)[1] or None)
    for n, priority in enumerate([2, None, 7, 10, 7, 1, 4]):
        _publish(pub, f"{p}-q", f"m{n}-{priority}", priority)
    deadline = time.monotonic() + 10
    while len(received) < 8 and time.monotonic() < deadline:
        while tags:  # prefetch 1: at most one
            ch.basic_ack(tags.pop())
        conn.process_data_events(0.05)
    pub_conn.close()
    conn.close()
    return received


def _ttl_at_the_priority_head(server: Server, p: str) -> Any:
    """Expired messages leave when they reach the head in priority order, not before."""
    conn, ch = _channel(server)
    ch.queue_declare(f"{p}-q", arguments={"x-max-priority": 5})
    _publish(ch, f"{p}-q", "a0-expiring", 0, expiration="50")
    _publish(ch, f"{p}-q", "b5", 5)
    _publish(ch, f"{p}-q", "c5-expiring", 5, expiration="50")
    _publish(ch, f"{p}-q", "d0", 0)
    conn.sleep(0.3)
    before = _ready(ch, f"{p}-q")  # the head (b5) is fresh: nothing has left yet
    got = drain_get(ch, f"{p}-q")
    conn.close()
    return before, got


def _drop_head(server: Server, p: str) -> Any:
    """Over x-max-length (and -bytes), the head of the highest priority goes."""
    conn, ch = _channel(server)
    ch.exchange_declare(f"{p}-dlx", "fanout")
    ch.queue_declare(f"{p}-dead")
    ch.queue_bind(f"{p}-dead", f"{p}-dlx")
    args = {"x-max-priority": 5, "x-max-length": 3, "x-dead-letter-exchange": f"{p}-dlx"}
    ch.queue_declare(f"{p}-q", arguments=args)
    for body, priority in [("a0", 0), ("b5", 5), ("c2", 2), ("d5", 5), ("e0", None), ("f1", 1)]:
        _publish(ch, f"{p}-q", body, priority)
    _wait_ready(ch, f"{p}-dead", 3)
    kept = drain_get(ch, f"{p}-q")
    dead = drain_get(ch, f"{p}-dead")
    ch.queue_declare(f"{p}-b", arguments={"x-max-priority": 3, "x-max-length-bytes": 4})
    for body, priority in [("aa", 1), ("bb", 3), ("cc", 0), ("dd", 2)]:
        _publish(ch, f"{p}-b", body, priority)
    by_bytes = drain_get(ch, f"{p}-b")
    conn.close()
    return kept, dead, by_bytes


def _dead_letters_into_a_priority_queue(server: Server, p: str) -> Any:
    """Messages that reach the queue by dead-lettering are ordered by their priority too."""
    conn, ch = _channel(server)
    ch.exchange_declare(f"{p}-dlx", "fanout")
    ch.queue_declare(f"{p}-prio", arguments={"x-max-priority": 9})
    ch.queue_bind(f"{p}-prio", f"{p}-dlx")
    ch.queue_declare(f"{p}-src", arguments={"x-dead-letter-exchange": f"{p}-dlx"})
    for n, priority in enumerate([1, 9, None, 4, 9, 1]):
        _publish(ch, f"{p}-src", f"m{n}", priority)
    for _ in range(6):
        method, _, _ = ch.basic_get(f"{p}-src")
        ch.basic_reject(method.delivery_tag, requeue=False)
    _wait_ready(ch, f"{p}-prio", 6)
    got = [(body, redelivered) for body, redelivered, *_ in drain_get(ch, f"{p}-prio")]
    conn.close()
    return got


@pytest.mark.parametrize(
    "scenario",
    [
        _get_order,
        _requeue_keeps_place,
        _consumer_order,
        _ttl_at_the_priority_head,
        _drop_head,
        _dead_letters_into_a_priority_queue,
    ],
)
def test_priority_queue_like_rabbitmq(servers: list[Server], names: str, scenario: Any) -> None:
    rabbit, gateway = run_both(servers, scenario, names)
    assert gateway == rabbit


def _random_sequence(seed: int) -> Any:
    def scenario(server: Server, p: str) -> Any:
        rng = random.Random(seed)
        conn, ch = _channel(server)
        maximum = rng.choice([1, 3, 10])
        ch.queue_declare(f"{p}-q", arguments={"x-max-priority": maximum})
        held: list[int] = []
        ready = 0
        outcome = []
        for step in range(60):
            op = rng.choice(["publish", "publish", "get", "get", "ack", "nack", "reject"])
            if op == "publish":
                for _ in range(rng.randint(1, 4)):
                    priority = rng.choice([None, 0, 1, 2, 3, 7, 10, 42])
                    _publish(ch, f"{p}-q", f"s{step}-{priority}-{ready}", priority)
                    ready += 1
            elif op == "get":
                method, _props, body = ch.basic_get(f"{p}-q")
                if method is None:
                    outcome.append("empty")
                    continue
                outcome.append((body, method.redelivered, method.message_count))
                held.append(method.delivery_tag)
                ready -= 1
            elif held:
                tag = held.pop(rng.randrange(len(held)))
                if op == "ack":
                    ch.basic_ack(tag)
                elif op == "nack":
                    ch.basic_nack(tag, requeue=True)
                    ready += 1
                    _wait_ready(ch, f"{p}-q", ready)
                else:
                    ch.basic_reject(tag, requeue=False)
        outcome.append(drain_get(ch, f"{p}-q"))
        conn.close()
        return outcome

    return scenario


@pytest.mark.parametrize("seed", range(6))
def test_random_sequences_like_rabbitmq(servers: list[Server], names: str, seed: int) -> None:
    rabbit, gateway = run_both(servers, _random_sequence(seed), names)
    assert gateway == rabbit
