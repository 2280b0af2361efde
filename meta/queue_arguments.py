"""Validation of queue.declare arguments (rabbit_amqqueue:declare_args/0), in RabbitMQ's order
and with its error terms, plus mqgw's own queue arguments.

The first failing argument closes the channel with 406 and
"invalid arg '<key>' for queue '<name>' in vhost '<vhost>': <term>".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meta.amqp_values import type_class
from meta.checks import queue_type_of
from meta.errors import PreconditionFailed, resource_name
from meta.group_pins import GROUPS_ARG, PinInvalid, parse_groups
from meta.models import QueueDef
from meta.partitions import GRAY_PARTITIONS_ARG, MAX_PARTITIONS, PARTITIONS_ARG, gray_refusal
from meta.queue_route import LOGICAL_ARG, MAX_LOGICAL, ORDERING_ARG, ORDERING_HEADER_ARG

MAX_EXPIRY_TIMER = 4294967295  # RabbitMQ's ?MAX_EXPIRY_TIMER (ms)
MAX_SUPPORTED_PRIORITY = 255  # RabbitMQ's ?MAX_SUPPORTED_PRIORITY
OVERFLOW_VALUES = ("drop-head", "reject-publish", "reject-publish-dlx")
REDELIVERY_VALUES = ("immediate", "backoff")
CONSUME_MODES = ("cluster", "broadcast")
DISK_OVERFLOW_VALUES = ("block", "drop-oldest")
DEAD_LETTER_STRATEGIES = ("at-most-once", "at-least-once")
LEADER_LOCATORS = ("client-local", "balanced", "random", "least-leaders")
# Queue types RabbitMQ 3.10 refuses exclusive, auto-delete and non-durable for
# (rabbit_queue_type_util:check_auto_delete/check_exclusive/check_non_durable, in that order).
REPLICATED_TYPES = ("quorum", "stream")
# rabbit_amqqueue:unit_value_in_ms/1
_AGE_UNITS_MS = {
    "Y": 365 * 86_400_000,
    "M": 30 * 86_400_000,
    "D": 86_400_000,
    "h": 3_600_000,
    "m": 60_000,
    "s": 1_000,
}
# Features that work on the queue's own position, which a broadcast queue never advances.
NOT_WITH_BROADCAST = (
    "x-message-ttl",
    "x-max-length",
    "x-max-length-bytes",
    "x-dead-letter-exchange",
    "x-expires",
    "x-max-age",
    "x-max-priority",  # each consumer reads its own position: there is no shared head
    "x-single-active-consumer",  # every consumer gets every message
)
# Arguments only some queue types take (their `queue_arguments` capability in RabbitMQ 3.10):
# not validated for the others, which refuse them after the other checks with
# "invalid arg '<key>' for <queue> of queue type rabbit_<type>_queue".
# A stream refuses every RabbitMQ argument but retention (x-max-length-bytes, x-max-age)
# and its own; only quorum queues take x-dead-letter-strategy.
_NOT_STREAM = ("classic", "quorum")
_QUEUE_TYPES_OF = {
    "x-expires": _NOT_STREAM,
    "x-message-ttl": _NOT_STREAM,
    "x-dead-letter-exchange": _NOT_STREAM,
    "x-dead-letter-routing-key": _NOT_STREAM,
    "x-max-length": _NOT_STREAM,
    "x-max-in-memory-length": _NOT_STREAM,
    "x-max-in-memory-bytes": _NOT_STREAM,
    "x-max-priority": ("classic",),
    "x-overflow": _NOT_STREAM,
    "x-queue-mode": _NOT_STREAM,
    "x-queue-version": _NOT_STREAM,
    "x-single-active-consumer": _NOT_STREAM,
    "x-quorum-initial-group-size": _NOT_STREAM,
    "x-initial-cluster-size": ("stream",),
    "x-stream-max-segment-size-bytes": ("stream",),
    "x-delivery-limit": _NOT_STREAM,
    "x-dead-letter-strategy": ("quorum",),
}


class _Invalid(Exception):
    def __init__(self, term: str) -> None:
        super().__init__(term)
        self.term = term


def _int(amqp_type: str, value: Any) -> int:
    if type_class(amqp_type) != "int":
        raise _Invalid(f'"expected integer, got {amqp_type}"')
    return int(value)


def _non_negative(amqp_type: str, value: Any, _q: QueueDef) -> None:
    number = _int(amqp_type, value)
    if number < 0:
        raise _Invalid(f"{{value_negative,{number}}}")


def _positive(amqp_type: str, value: Any, _q: QueueDef) -> None:
    number = _int(amqp_type, value)
    if number == 0:
        raise _Invalid("{value_zero,0}")
    if number < 0:
        raise _Invalid(f"{{value_negative,{number}}}")


def _expiry(amqp_type: str, value: Any, queue: QueueDef, zero_ok: bool) -> None:
    number = _int(amqp_type, value)
    if number == 0 and not zero_ok:
        raise _Invalid("{value_zero,0}")
    if number < 0:
        raise _Invalid(f"{{value_negative,{number}}}")
    if number > MAX_EXPIRY_TIMER:
        raise _Invalid(f"{{value_too_large,{number},{MAX_EXPIRY_TIMER}}}")


def _expires(amqp_type: str, value: Any, queue: QueueDef) -> None:
    _expiry(amqp_type, value, queue, zero_ok=False)


def _message_ttl(amqp_type: str, value: Any, queue: QueueDef) -> None:
    _expiry(amqp_type, value, queue, zero_ok=True)


def _max_priority(amqp_type: str, value: Any, queue: QueueDef) -> None:
    """rabbit_amqqueue:check_max_priority_arg/2: a non-negative integer up to 255."""
    _non_negative(amqp_type, value, queue)
    if int(value) > MAX_SUPPORTED_PRIORITY:
        raise _Invalid(f"{{max_value_exceeded,{int(value)}}}")


def _groups(amqp_type: str, value: Any, queue: QueueDef) -> None:
    """x-mqgw-groups (meta/group_pins.py): a list of broker group names, or "g1,g2"."""
    try:
        parse_groups(value)
    except PinInvalid as invalid:
        raise _Invalid(str(invalid)) from None


def _partitions(amqp_type: str, value: Any, queue: QueueDef) -> None:
    """x-mqgw-partitions (meta/partitions.py): 1 to 256; a stream has one."""
    _positive(amqp_type, value, queue)
    if int(value) > MAX_PARTITIONS:
        raise _Invalid(f"{{value_too_large,{int(value)},{MAX_PARTITIONS}}}")
    if queue_type_of(queue) == "stream" and int(value) != 1:
        raise _Invalid("a stream has one partition")


def _gray_partitions(amqp_type: str, value: Any, queue: QueueDef) -> None:
    """x-mqgw-gray-partitions: K >= 0; K > 0 on a classic FIFO queue with more than K
    partitions (``queue.partitions`` is set before the checks run)."""
    _non_negative(amqp_type, value, queue)
    number = int(value)
    if number == 0:
        return
    refusal = gray_refusal(queue)
    if refusal is not None:
        raise _Invalid(f"gray partitions need a classic FIFO queue, not one with {refusal}")
    if number >= queue.partitions:
        raise _Invalid(
            f"{GRAY_PARTITIONS_ARG} {number} needs more than {queue.partitions} partitions "
            f"({PARTITIONS_ARG})"
        )


def _ordering(amqp_type: str, value: Any, queue: QueueDef) -> None:
    """x-mqgw-ordering (meta/queue_route.py): "key" on a classic FIFO queue."""
    if amqp_type not in ("longstr", "shortstr") or value != "key":
        raise _Invalid('{unknown_ordering,expected "key"}')
    refusal = gray_refusal(queue)
    if refusal is not None:
        raise _Invalid(f"keyed order needs a classic FIFO queue, not one with {refusal}")
    gray = queue.arguments.get(GRAY_PARTITIONS_ARG)
    if gray:
        raise _Invalid(f"keyed order and {GRAY_PARTITIONS_ARG} do not go together")


def _logical_partitions(amqp_type: str, value: Any, queue: QueueDef) -> None:
    """x-mqgw-logical-partitions: 1 to 65536, at least the queue's partitions."""
    _positive(amqp_type, value, queue)
    number = int(value)
    if number > MAX_LOGICAL:
        raise _Invalid(f"{{value_too_large,{number},{MAX_LOGICAL}}}")
    if number < queue.partitions:
        raise _Invalid(f"{number} logical partitions cannot cover {queue.partitions} partitions")


def _header_name(amqp_type: str, value: Any, _q: QueueDef) -> None:
    if amqp_type not in ("longstr", "shortstr") or not value:
        raise _Invalid("{expected_header_name}")


def _bool(amqp_type: str, _value: Any, _q: QueueDef) -> None:
    """rabbit_amqqueue:check_bool_arg/2."""
    if amqp_type != "bool":
        raise _Invalid(f"{{unacceptable_type,{amqp_type}}}")


def _dlrk(amqp_type: str, _value: Any, queue: QueueDef) -> None:
    if "x-dead-letter-exchange" not in queue.arguments:
        raise _Invalid("routing_key_but_no_dlx_defined")
    if amqp_type != "longstr":
        raise _Invalid(f"{{unacceptable_type,{amqp_type}}}")


def _one_of(values: tuple[str, ...], term: str) -> Callable[[str, Any, QueueDef], None]:
    def check(amqp_type: str, value: Any, _q: QueueDef) -> None:
        if amqp_type != "longstr":
            raise _Invalid(f"{{unacceptable_type,{amqp_type}}}")
        if value not in values:
            raise _Invalid(term)

    return check


def parse_max_age(value: str) -> int | None:
    """RabbitMQ's x-max-age ("7D", "12h", "30m"...: a positive integer and one of Y M D h m
    s) in milliseconds; None if it is not one."""
    digits = len(value) - len(value.lstrip("0123456789"))
    number, unit = value[:digits], value[digits:]
    if not number or int(number) <= 0 or unit not in _AGE_UNITS_MS:
        return None
    return int(number) * _AGE_UNITS_MS[unit]


def _max_age(amqp_type: str, value: Any, _q: QueueDef) -> None:
    if amqp_type != "longstr":
        raise _Invalid(f"{{unacceptable_type,{amqp_type}}}")
    if parse_max_age(str(value)) is None:
        raise _Invalid("invalid_max_age")


# In rabbit_amqqueue:declare_args/0 order (the first failure is the one reported);
# mqgw's own arguments follow.
_CHECKS: tuple[tuple[str, Callable[[str, Any, QueueDef], None]], ...] = (
    ("x-expires", _expires),
    ("x-message-ttl", _message_ttl),
    ("x-dead-letter-routing-key", _dlrk),
    ("x-max-length", _non_negative),
    ("x-max-length-bytes", _non_negative),
    ("x-max-priority", _max_priority),
    ("x-overflow", _one_of(OVERFLOW_VALUES, "invalid_overflow")),
    ("x-single-active-consumer", _bool),
    ("x-initial-cluster-size", _positive),
    ("x-max-age", _max_age),
    ("x-stream-max-segment-size-bytes", _non_negative),
    ("x-queue-leader-locator", _one_of(LEADER_LOCATORS, "invalid_queue_locator_arg")),
    ("x-dead-letter-strategy", _one_of(DEAD_LETTER_STRATEGIES, "invalid_dlx_strategy")),
    ("x-delivery-limit", _non_negative),
    ("x-consumer-timeout", _positive),
    ("x-redelivery", _one_of(REDELIVERY_VALUES, "invalid_redelivery")),
    ("x-max-redeliveries", _positive),
    ("x-consume-mode", _one_of(CONSUME_MODES, "invalid_consume_mode")),
    ("x-disk-overflow", _one_of(DISK_OVERFLOW_VALUES, "invalid_disk_overflow")),
    (PARTITIONS_ARG, _partitions),
    (GROUPS_ARG, _groups),
    (GRAY_PARTITIONS_ARG, _gray_partitions),
    (ORDERING_ARG, _ordering),
    (LOGICAL_ARG, _logical_partitions),
    (ORDERING_HEADER_ARG, _header_name),
)


def check_queue_arguments(queue: QueueDef) -> None:
    if queue.arguments.get("x-consume-mode") == "broadcast":
        for key in NOT_WITH_BROADCAST:
            if key in queue.arguments:
                resource = resource_name("queue", queue.name, queue.vhost)
                raise PreconditionFailed(
                    f"invalid arg '{key}' for {resource}: not supported with "
                    "x-consume-mode broadcast (each consumer has its own position)"
                )
    queue_type = queue_type_of(queue)
    for key, check in _CHECKS:
        if key not in queue.arguments or queue_type not in _QUEUE_TYPES_OF.get(key, (queue_type,)):
            continue
        try:
            check(queue.argument_type(key), queue.arguments[key], queue)
        except _Invalid as invalid:
            resource = resource_name("queue", queue.name, queue.vhost)
            raise PreconditionFailed(
                f"invalid arg '{key}' for {resource}: {invalid.term}"
            ) from None
    for key, queue_types in _QUEUE_TYPES_OF.items():
        if key in queue.arguments and queue_type not in queue_types:
            resource = resource_name("queue", queue.name, queue.vhost)
            raise PreconditionFailed(
                f"invalid arg '{key}' for {resource} of queue type rabbit_{queue_type}_queue"
            )
    if queue_type in REPLICATED_TYPES:
        _check_replicated_properties(queue)


def _check_replicated_properties(queue: QueueDef) -> None:
    """Quorum and stream queues are durable, shared and kept (RabbitMQ's order and texts)."""
    for refused, name in (
        (queue.auto_delete, "auto-delete"),
        (queue.exclusive_owner is not None, "exclusive-owner"),
        (not queue.durable, "non-durable"),
    ):
        if refused:
            resource = resource_name("queue", queue.name, queue.vhost)
            raise PreconditionFailed(f"invalid property '{name}' for {resource}")
