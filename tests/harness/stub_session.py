"""The one session stub: for tests of the push and broadcast schedulers it books each delivery
on the consumer's channel exactly as the real session does and records who got what; for the
node's alarms it records the connection.blocked notices it was given."""

from __future__ import annotations

import time
from typing import Any

from gateway.queues.consumer import Taken
from gateway.queues.runtime import QueueRuntime
from gateway.sessions.channel_state import Consumer


class StubSession:
    writable = True
    stopped = False  # consumption controls: none in force
    limits = None

    def __init__(self) -> None:
        self.deliveries: list[tuple[str, bytes, bool]] = []  # (consumer tag, body, redelivered)
        self.queues: list[str] = []  # the queue of each delivery, in the same order
        self.notices: list[tuple[bool, str]] = []  # (blocked, reason) per notify_blocked

    def notify_blocked(self, blocked: bool, reason: str) -> None:
        self.notices.append((blocked, reason))

    def deliver(
        self,
        consumer: Consumer,
        queue: QueueRuntime,
        partition: int,
        message: Any,
        redelivered: bool,
    ) -> None:
        consumer.channel.record_delivery(consumer, queue, partition, message, time.monotonic)
        self.deliveries.append((consumer.tag, bytes(message.body), redelivered))
        self.queues.append(queue.name)

    def deliver_run(self, consumer: Consumer, queue: QueueRuntime, run: list[Taken]) -> None:
        for partition, message, redelivered in run:
            self.deliver(consumer, queue, partition, message, redelivered)

    def byte_room(self) -> int:
        return 1 << 62  # no output backlog here

    def from_queues(self) -> list[tuple[str, bytes]]:
        """(queue, body) of each delivery, in order."""
        pairs = zip(self.queues, self.deliveries, strict=True)
        return [(queue, body) for queue, (_, body, _) in pairs]

    def got(self, tag: str) -> list[bytes]:
        """The bodies consumer ``tag`` was given, in order."""
        return [body for who, body, _ in self.deliveries if who == tag]
