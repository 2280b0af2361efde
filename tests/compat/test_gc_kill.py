"""Copy-forward collection under load, killed with SIGKILL at random points: a stuck queue's
messages are relocated again and again while a busy queue is published and consumed; after
every kill the gateway restarts on its data. Nothing confirmed is lost, and a message seen
twice was flagged redelivered the second time."""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.harness.processes import GatewayProcess

ENV = {
    "MQGW_SEGMENT_SIZE_BYTES": str(128 << 10),
    "MQGW_MAX_MESSAGE_SIZE_BYTES": str(32 << 10),  # a segment must hold the largest message
    "MQGW_RETENTION_CHECK_INTERVAL_MS": "50",
    "MQGW_CHECKPOINT_INTERVAL_MS": "100",
    "MQGW_OFFSET_PERSIST_INTERVAL_MS": "100",
    "MQGW_GC_MAX_LIVE_RATIO": "0.5",
}
BODY = b"." * 500
# Persistent: transient messages do not survive a restart (as in RabbitMQ), and this test
# restarts after every kill.
PERSISTENT = pika.BasicProperties(delivery_mode=2)


class Traffic:
    """A publisher (confirms) and a consumer (acks) in threads until the gateway dies."""

    def __init__(self, url: str, first_id: int) -> None:
        self.url = url
        self.next_id = first_id
        self.confirmed_busy: list[int] = []
        self.confirmed_stuck: list[int] = []
        self.attempted_stuck: list[int] = []
        self.consumed: list[tuple[int, bool]] = []
        self.threads = [
            threading.Thread(target=self._publish, daemon=True),
            threading.Thread(target=self._consume, daemon=True),
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(30)
            assert not thread.is_alive()

    def _publish(self) -> None:
        try:
            conn = pika.BlockingConnection(pika.URLParameters(self.url))
            ch = conn.channel()
            ch.confirm_delivery()
            while True:
                i = self.next_id
                self.next_id += 1
                if i % 25 == 0:
                    self.attempted_stuck.append(i)
                    ch.basic_publish("", "stuck", b"%08d" % i + BODY, PERSISTENT)
                    self.confirmed_stuck.append(i)
                else:
                    ch.basic_publish("", "busy", b"%08d" % i + BODY, PERSISTENT)
                    self.confirmed_busy.append(i)
        except (pika.exceptions.AMQPError, OSError):
            return  # the gateway was killed: what was not confirmed does not count

    def _consume(self) -> None:
        try:
            conn = pika.BlockingConnection(pika.URLParameters(self.url))
            ch = conn.channel()
            ch.basic_qos(prefetch_count=50)
            for method, _props, body in ch.consume("busy"):
                self.consumed.append((int(body[:8]), bool(method.redelivered)))
                ch.basic_ack(method.delivery_tag)
        except (pika.exceptions.AMQPError, OSError):
            return


def _drain(url: str, queue: str) -> list[tuple[int, bool]]:
    got = []
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        ch = conn.channel()
        for method, _props, body in ch.consume(queue, inactivity_timeout=2):
            if method is None:
                break
            got.append((int(body[:8]), bool(method.redelivered)))
            ch.basic_ack(method.delivery_tag)
    return got


@pytest.mark.parametrize(
    "rounds", [4, pytest.param(15, marks=pytest.mark.slow, id="soak")], ids=str
)
def test_collection_killed_at_random_points_loses_nothing(tmp_path: Path, rounds: int) -> None:
    rng = random.Random(rounds)
    gateway = GatewayProcess(tmp_path / "data", env=ENV).start()
    busy_confirmed: list[int] = []
    stuck_confirmed: list[int] = []
    stuck_attempted: list[int] = []
    consumed: list[tuple[int, bool]] = []
    collected_rounds = 0
    next_id = 0
    try:
        with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
            ch = conn.channel()
            ch.queue_declare("busy", durable=True)
            ch.queue_declare("stuck", durable=True)
        for _ in range(rounds):
            traffic = Traffic(gateway.url, next_id)
            traffic.start()
            time.sleep(rng.uniform(1.0, 3.0))  # the kill point: wherever the load is then
            assert gateway.stop(signal.SIGKILL) == -signal.SIGKILL
            traffic.join()
            collected_rounds += "garbage collector: moved" in gateway.log()
            next_id = traffic.next_id + 1
            busy_confirmed += traffic.confirmed_busy
            stuck_confirmed += traffic.confirmed_stuck
            stuck_attempted += traffic.attempted_stuck
            consumed += traffic.consumed
            gateway.start()
        consumed += _drain(gateway.url, "busy")
        stuck = _drain(gateway.url, "stuck")
    finally:
        gateway.stop()
    assert collected_rounds >= rounds // 2, "the collector hardly ran: nothing was tested"
    # The stuck queue: every confirmed message once, nothing else.
    stuck_ids = [i for i, _ in stuck]
    assert len(stuck_ids) == len(set(stuck_ids))
    assert set(stuck_confirmed) <= set(stuck_ids) <= set(stuck_attempted)
    # The busy queue: every confirmed message at least once; a repeat is flagged redelivered.
    seen = Counter(i for i, _ in consumed)
    assert not set(busy_confirmed) - set(seen)
    first: set[int] = set()
    for i, redelivered in consumed:
        assert i not in first or redelivered, f"message {i} delivered again without the flag"
        first.add(i)
