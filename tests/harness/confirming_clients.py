"""pika clients in threads for tests under load: publishers with confirms on several channels
(each its own sticky partition) and a consumer with manual acks, both keeping what they saw
for the test to check (none lost, none twice unless flagged redelivered, each channel in
order)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pika


class ChannelPublishers(threading.Thread):
    """``channels`` channels on one connection, each publishing ``"<tag><c>:<n>"`` in turn,
    persistent, waiting for each confirm."""

    def __init__(self, url: str, queue: str, tag: str = "", channels: int = 3,
                 pause_s: float = 0.002) -> None:  # fmt: skip
        super().__init__(daemon=True)
        self.url, self.queue, self.tag = url, queue, tag
        self.channels, self.pause_s = channels, pause_s
        self.confirmed: list[bytes] = []
        self.nacked = 0
        self.latencies: list[tuple[float, float]] = []  # (when sent, publish-to-confirm s)
        self.stop = threading.Event()

    def run(self) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        channels = [conn.channel() for _ in range(self.channels)]
        for channel in channels:
            channel.confirm_delivery()
        properties = pika.BasicProperties(delivery_mode=2)
        n = 0
        while not self.stop.is_set():
            for c, channel in enumerate(channels):
                body = f"{self.tag}{c}:{n}".encode()
                sent = time.monotonic()
                try:
                    channel.basic_publish("", self.queue, body, properties)
                    self.confirmed.append(body)
                    self.latencies.append((sent, time.monotonic() - sent))
                except pika.exceptions.NackError:
                    self.nacked += 1
            n += 1
            time.sleep(self.pause_s)
        conn.close()


class AckingConsumer(threading.Thread):
    """basic.consume on ``queues`` with manual acks (``delay_s`` before each: a slow one);
    ``received`` keeps (body, redelivered)."""

    def __init__(self, url: str, queues: str | Sequence[str], delay_s: float = 0.0,
                 prefetch: int = 50) -> None:  # fmt: skip
        super().__init__(daemon=True)
        self.url = url
        self.queues = [queues] if isinstance(queues, str) else list(queues)
        self.delay_s, self.prefetch = delay_s, prefetch
        self.received: list[tuple[bytes, bool]] = []
        self.stop = threading.Event()

    def bodies(self) -> list[bytes]:
        return [body for body, _ in self.received]

    def run(self) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        channel = conn.channel()
        channel.basic_qos(prefetch_count=self.prefetch)

        def take(ch: Any, method: Any, _properties: Any, body: bytes) -> None:
            if self.delay_s:
                time.sleep(self.delay_s)  # a slow consumer
            self.received.append((body, bool(method.redelivered)))
            ch.basic_ack(method.delivery_tag)

        for queue in self.queues:
            channel.basic_consume(queue, take)
        while not self.stop.is_set():
            conn.process_data_events(time_limit=0.1)
        conn.close()
