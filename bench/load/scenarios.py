"""The benchmark scenarios: what is published, how it is consumed, and which figures compare.

The many-queues scenarios measure delivery across queues (the push scheduler), so their queues
are transient: declaring 10k durable queues measures the metadata store instead (every run
reports its declare time as ``setup_seconds``).

Message counts are the issue's numbers at ``scale=1``; ``--scale`` shrinks them (and the
deadlines, within limits) for quick runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

DEFAULT_RATIOS = ("msgs_per_s", "p99_ms", "cpu_s_per_100k")


@dataclass(frozen=True)
class Scenario:
    name: str
    messages: int  # publishes at scale 1
    body_bytes: int
    persistent: bool = True
    durable: bool = True
    confirm_window: int = 1000  # 0: no publisher confirms
    queues: int = 1
    fanout: bool = False  # one fanout exchange bound to every queue (else default exchange)
    prefetch: int = 1000
    no_ack: bool = False
    ack_each: bool = False  # one basic.ack per message (multiple=false), as most clients do
    backlog: bool = False  # publish everything with no consumer, then drain
    slow_queues: int = 0  # the first N queues get a consumer that acks 10 msgs/s
    slow_ack_per_s: float = 10.0
    deadline_s: float = 600.0  # at scale 1
    ratio_fields: tuple[str, ...] = DEFAULT_RATIOS
    description: str = ""
    # Keyed order (docs/ordering.md): ``keys`` routing keys into one queue through a topic
    # exchange, ``consumers`` on it; mqgw declares it x-mqgw-ordering: key over
    # ``partitions``, RabbitMQ as a single-active-consumer queue (its only way to keep order).
    keys: int = 0
    consumers: int = 1
    partitions: int = 1

    def count(self, scale: float) -> int:
        return max(1, round(self.messages * scale))

    def deadline(self, scale: float) -> float:
        """Scaled down with the counts, but never below a floor that covers setup."""
        return max(60.0, self.deadline_s * min(1.0, scale * 2))


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "confirm-durable-1k",
            200_000,
            1024,
            description="confirms window 1000, persistent 1 KB, durable queue, ack prefetch 1000",
        ),
        Scenario(
            "confirm-durable-100b",
            200_000,
            100,
            description="confirms window 1000, persistent 100 B, durable queue, ack prefetch 1000",
        ),
        Scenario(
            "ack-each-100b",
            200_000,
            100,
            ack_each=True,
            description="confirm-durable-100b with a consumer that acks every message on its "
            "own (pika's basic_ack(tag) per message, Celery, most Java consumers)",
        ),
        Scenario(
            "transient-autoack",
            500_000,
            100,
            persistent=False,
            durable=False,
            confirm_window=0,
            no_ack=True,
            description="transient 100 B, no confirms, no-ack consumer",
        ),
        Scenario(
            "fanout-10",
            50_000,
            1024,
            queues=10,
            fanout=True,
            description="fanout to 10 durable queues, confirms, persistent 1 KB",
        ),
        Scenario(
            "many-queues-1k",
            100_000,
            100,
            queues=1_000,
            prefetch=10,
            persistent=False,
            durable=False,
            ratio_fields=(*DEFAULT_RATIOS, "min_queue_share_at_publish_end"),
            description="1,000 transient queues, round-robin, prefetch 10 each, confirms",
        ),
        Scenario(
            "many-queues-10k",
            200_000,
            100,
            queues=10_000,
            prefetch=10,
            persistent=False,
            durable=False,
            ratio_fields=(*DEFAULT_RATIOS, "min_queue_share_at_publish_end"),
            description="10,000 transient queues, round-robin, prefetch 10 each, confirms",
        ),
        Scenario(
            "backlog-1m",
            1_000_000,
            100,
            backlog=True,
            deadline_s=1800.0,
            ratio_fields=(
                "msgs_per_s",
                "cpu_s_per_100k",
                "publish_first_per_s",
                "publish_last_per_s",
                "drain_per_s",
                "rss_end_mb",
                "disk_after_drain_mb",
            ),
            description="1M persistent 100 B with no consumer, then one consumer drains",
        ),
        *(
            Scenario(
                f"keyed-{p}p",
                100_000,
                1024,
                keys=1_000,
                consumers=4,
                partitions=p,
                prefetch=100,
                description=f"keyed order: 1,000 keys, 4 consumers, {p} partition(s) "
                "(RabbitMQ: a single-active-consumer queue), confirms, persistent 1 KB",
            )
            for p in (1, 4, 8)
        ),
        Scenario(
            "slow-consumer",
            100_000,
            1024,
            queues=10,
            slow_queues=1,
            ratio_fields=("msgs_per_s", "fast_p99_ms", "cpu_s_per_100k"),
            description="one queue's consumer acks 10 msgs/s beside 9 fast queues",
        ),
    )
}


def queue_arguments(scenario: Scenario, target_label: str) -> dict[str, Any]:
    """What the scenario's queues are declared with on this target."""
    if not scenario.keys:
        return {}
    if target_label == "rabbitmq":
        return {"x-single-active-consumer": True}
    return {"x-mqgw-ordering": "key", "x-mqgw-partitions": scenario.partitions}


def split_counts(total: int, parts: int) -> list[int]:
    """``total`` spread as evenly as possible over ``parts``."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def per_route_bound(count: int, routes: int) -> int:
    """The most messages one route gets when ``count`` go round-robin over ``routes``."""
    return math.ceil(count / routes) if routes else 0
