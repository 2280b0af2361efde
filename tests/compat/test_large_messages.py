"""Large messages with pika against a real gateway: RabbitMQ 3.10's default limit (128 MiB)
lets a 100 MiB message through, and fan-out does not multiply its cost: the publish keeps
one body for every queue (one record), and the queues' readers share one read of it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pika

from bench.processes import tree_rss_mb
from tests.harness.processes import GatewayProcess

BODY_MB = 100
QUEUES = 3


class PeakRss(threading.Thread):
    """The highest RSS of the gateway's process tree, sampled every 10 ms."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak_mb = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.peak_mb = max(self.peak_mb, tree_rss_mb(self.pid))
            time.sleep(0.01)

    def stop(self) -> float:
        self.done.set()
        self.join(5)
        return self.peak_mb


def _consume_one(url: str, queue: str, results: list[bool], body: bytes) -> None:
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        ch = conn.channel()
        for method, _props, data in ch.consume(queue, inactivity_timeout=60):
            results.append(method is not None and data == body)
            if method is not None:
                ch.basic_ack(method.delivery_tag)
            break


def test_a_100_mib_message_fanned_out_to_three_queues(tmp_path: Path) -> None:
    gateway = GatewayProcess(tmp_path / "data").start()
    try:
        with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
            ch = conn.channel()
            ch.exchange_declare("fan", "fanout")
            for i in range(QUEUES):
                ch.queue_declare(f"q{i}")
                ch.queue_bind(f"q{i}", "fan")
            ch.confirm_delivery()
            body = bytes(range(256)) * (BODY_MB << 12)  # 100 MiB, not all one byte
            time.sleep(0.5)
            base_mb = tree_rss_mb(gateway.pid)
            peak = PeakRss(gateway.pid)
            peak.start()
            ch.basic_publish("fan", "", body)  # confirmed: stored for the three queues
            results: list[bool] = []
            consumers = [
                threading.Thread(target=_consume_one, args=(gateway.url, f"q{i}", results, body))
                for i in range(QUEUES)
            ]
            for consumer in consumers:
                consumer.start()
            for consumer in consumers:
                consumer.join(120)
            growth_mb = peak.stop() - base_mb
        assert results == [True] * QUEUES
        # One body on the way in (and its copy into the commitlog write), one read shared by
        # the three deliveries; not three of everything.
        assert growth_mb < QUEUES * BODY_MB, f"RSS grew by {growth_mb:.0f} MB"
    finally:
        gateway.stop()
