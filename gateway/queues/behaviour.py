"""What a queue does beyond FIFO: TTL, expiry, dead-lettering, limits, redelivery, timeout.

Each setting comes from the queue's ``x-`` argument or from the policy that applies to the
queue, combined as RabbitMQ combines them (rabbit_amqqueue_process:process_args_policy):
numeric limits take the smaller of the two, everything else prefers the argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meta.autoscale_policy import AutoscaleSpec, autoscale_of
from meta.breaker_policy import BreakerSpec, breaker_of
from meta.queue_arguments import parse_max_age

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
REDELIVERY_MODES = ("immediate", "backoff")
DISK_OVERFLOW_MODES = ("block", "drop-oldest")
DEFAULT_MAX_REDELIVERIES = 16


@dataclass(frozen=True, slots=True)
class QueueBehaviour:
    message_ttl_ms: int | None = None
    expires_ms: int | None = None
    dlx: str | None = None
    dlrk: str | None = None
    max_length: int | None = None
    max_length_bytes: int | None = None
    overflow: str = "drop-head"
    redelivery: str = "immediate"
    max_redeliveries: int = DEFAULT_MAX_REDELIVERIES
    delivery_limit: int | None = None
    consumer_timeout_ms: int | None = None
    counts_deliveries: bool = False  # quorum-queue style: x-delivery-count on every delivery
    max_age_ms: int | None = None  # x-max-age: older ready messages are dropped (retention)
    disk_overflow: str = "block"  # drop-oldest: over the disk budget, its oldest ones go
    # x-dead-letter-strategy at-least-once (gateway/queues/dead_letter.py): RabbitMQ applies it to
    # quorum queues with x-overflow reject-publish and a dead-letter exchange only.
    dead_letter_at_least_once: bool = False
    # Gray release (gateway/queues/gray_lanes.py): the first ceil(K/2) and last floor(K/2)
    # partitions carry gray traffic; 0 is none.
    gray_partitions: int = 0
    breaker: BreakerSpec | None = None  # policy ``breaker`` (gateway/queues/breaker.py)
    autoscale: AutoscaleSpec | None = None  # policy ``autoscale`` (gateway/vhost/autoscale.py)

    @property
    def has_limits(self) -> bool:
        return self.max_length is not None or self.max_length_bytes is not None

    @property
    def rejects_publish(self) -> bool:
        return self.has_limits and self.overflow != "drop-head"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _age(value: Any) -> int | None:
    return parse_max_age(value) if isinstance(value, str) else None


def _smaller(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _gray_partitions(argument: Any, policy: Any) -> int:
    """The argument wins over the policy (as RabbitMQ prefers arguments for non-limits)."""
    chosen = _int(argument)
    if chosen is None:
        chosen = _int(policy)
    return chosen if chosen is not None and chosen > 0 else 0


def behaviour_of(
    arguments: Mapping[str, Any], policy: Mapping[str, Any] | None = None
) -> QueueBehaviour:
    """Combine a queue's arguments with the definition of the policy that applies to it."""
    pol = policy or {}

    def arg(name: str) -> Any:
        return arguments.get(f"x-{name}")

    overflow = _str(arg("overflow")) or _str(pol.get("overflow")) or "drop-head"
    redelivery = _str(arg("redelivery")) or _str(pol.get("redelivery")) or "immediate"
    dlx = _str(arg("dead-letter-exchange"))
    dlrk = _str(arg("dead-letter-routing-key"))
    if dlx is None:
        dlx = _str(pol.get("dead-letter-exchange"))
        if dlrk is None:
            dlrk = _str(pol.get("dead-letter-routing-key"))
    max_redeliveries = _int(arg("max-redeliveries")) or _int(pol.get("max-redeliveries"))
    disk_overflow = _str(arg("disk-overflow")) or _str(pol.get("disk-overflow")) or "block"
    strategy = _str(arg("dead-letter-strategy")) or _str(pol.get("dead-letter-strategy"))
    quorum = arg("queue-type") == "quorum"
    return QueueBehaviour(
        message_ttl_ms=_smaller(_int(arg("message-ttl")), _int(pol.get("message-ttl"))),
        expires_ms=_smaller(_int(arg("expires")), _int(pol.get("expires"))),
        dlx=dlx,
        dlrk=dlrk,
        max_length=_smaller(_int(arg("max-length")), _int(pol.get("max-length"))),
        max_length_bytes=_smaller(_int(arg("max-length-bytes")), _int(pol.get("max-length-bytes"))),
        overflow=overflow if overflow in OVERFLOW_MODES else "drop-head",
        redelivery=redelivery if redelivery in REDELIVERY_MODES else "immediate",
        max_redeliveries=max_redeliveries or DEFAULT_MAX_REDELIVERIES,
        delivery_limit=_smaller(_int(arg("delivery-limit")), _int(pol.get("delivery-limit"))),
        consumer_timeout_ms=_smaller(
            _int(arg("consumer-timeout")), _int(pol.get("consumer-timeout"))
        ),
        max_age_ms=_smaller(_age(arg("max-age")), _age(pol.get("max-age"))),
        disk_overflow=disk_overflow if disk_overflow in DISK_OVERFLOW_MODES else "block",
        dead_letter_at_least_once=quorum
        and strategy == "at-least-once"
        and overflow == "reject-publish"
        and dlx is not None,
        gray_partitions=_gray_partitions(arg("mqgw-gray-partitions"), pol.get("gray-partitions")),
        breaker=breaker_of(pol),
        autoscale=autoscale_of(pol),
        counts_deliveries=quorum
        or _int(arg("delivery-limit")) is not None
        or _int(pol.get("delivery-limit")) is not None,
    )
