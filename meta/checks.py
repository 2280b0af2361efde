"""RabbitMQ's declare/bind rules: reserved names, equivalence, binding validation.

Each check raises the typed error with the detail text RabbitMQ produces
(rabbit_channel, rabbit_exchange, rabbit_amqqueue, rabbit_misc, exchange type modules).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meta.amqp_values import erlang_repr, erlang_term, erlang_text, infer_type, type_class
from meta.errors import (
    AccessRefused,
    CommandInvalid,
    PreconditionFailed,
    ResourceLocked,
    resource_name,
)
from meta.models import (
    BUILTIN_EXCHANGE_TYPES,
    DELAYED_MESSAGE_EXCHANGE_TYPE,
    BindingDef,
    ExchangeDef,
    QueueDef,
)

QUEUE_TYPE_ARG = "x-queue-type"
DEFAULT_QUEUE_TYPE = "classic"

# Arguments compared on redeclare, per queue type, in RabbitMQ's order
# (the `queue_arguments` capability of rabbit_{classic,quorum,stream}_queue).
QUEUE_TYPE_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "classic": (
        "x-expires",
        "x-message-ttl",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-priority",
        "x-overflow",
        "x-queue-mode",
        "x-queue-version",
        "x-single-active-consumer",
        "x-queue-type",
        "x-queue-master-locator",
        "x-queue-leader-locator",
        # mqgw's own queue arguments (not RabbitMQ's): changing them needs a new queue.
        "x-consume-mode",
        "x-redelivery",
        "x-max-redeliveries",
        "x-max-age",
        "x-disk-overflow",
        "x-mqgw-partitions",
    ),
    "quorum": (
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-dead-letter-strategy",
        "x-expires",
        "x-max-length",
        "x-max-length-bytes",
        "x-max-in-memory-length",
        "x-max-in-memory-bytes",
        "x-overflow",
        "x-single-active-consumer",
        "x-queue-type",
        "x-quorum-initial-group-size",
        "x-member-placement-tag",
        "x-delivery-limit",
        "x-message-ttl",
        "x-queue-leader-locator",
        "x-consumer-disconnected-timeout",
        "x-consumer-timeout",
        "x-delayed-retry-type",
        "x-delayed-retry-min",
        "x-delayed-retry-max",
        "x-mqgw-partitions",  # mqgw's: the partitions are fixed at creation
    ),
    "stream": (
        "x-max-length-bytes",
        "x-queue-type",
        "x-max-age",
        "x-stream-max-segment-size-bytes",
        "x-stream-filter-size-bytes",
        "x-initial-cluster-size",
        "x-queue-leader-locator",
        "x-mqgw-partitions",
    ),
}
EXCHANGE_EQUIVALENCE_ARGUMENTS = ("alternate-exchange",)
X_MATCH_VALUES = frozenset({"all", "any", "all-with-x", "any-with-x"})
MAX_TOPIC_HASH_WILDCARDS = 2  # RabbitMQ >= 4.3.1 rejects binding keys with more '#'

TypedValue = tuple[str, Any]


def check_name_not_reserved(kind: str, name: str) -> None:
    """rabbit_channel:check_name/2: only on creation (or any non-passive queue declare)."""
    if name.startswith("amq."):
        raise AccessRefused(f"{kind} name '{name}' contains reserved prefix 'amq.*'")


def check_not_default_exchange(name: str) -> None:
    if name == "":
        raise AccessRefused("operation not permitted on the default exchange")


def check_exchange_deletion(vhost: str, name: str) -> None:
    check_not_default_exchange(name)
    if name.startswith("amq."):
        raise AccessRefused(
            f"deletion of system {resource_name('exchange', name, vhost)} not allowed"
        )


def check_exclusive_access(queue: QueueDef, owner: str | None, *, strict: bool = False) -> None:
    """rabbit_amqqueue:check_exclusive_access/3 (``strict`` on redeclare, lax otherwise)."""
    if queue.exclusive_owner == owner or (not strict and queue.exclusive_owner is None):
        return
    raise ResourceLocked(
        "cannot obtain exclusive access to locked "
        f"{resource_name('queue', queue.name, queue.vhost)}. It could be originally "
        "declared on another connection or the exclusive property value does not "
        "match that of the original declaration."
    )


def _describe(value: TypedValue | Any | None, typed: bool) -> str:
    """rabbit_misc:val/1."""
    if value is None:
        return "none"
    if typed:
        amqp_type, raw = value
        return f"the value '{erlang_text(raw)}' of type '{amqp_type}'"
    return f"'{erlang_text(value)}'"


def _inequivalent(key: str, resource: str, received: str, current: str) -> PreconditionFailed:
    return PreconditionFailed(
        f"inequivalent arg '{key}' for {resource}: received {received} but current is {current}"
    )


def assert_field_equivalent(current: Any, received: Any, resource: str, key: str) -> None:
    if current != received or type(current) is not type(received):
        raise _inequivalent(key, resource, _describe(received, False), _describe(current, False))


def _lookup(arguments: Mapping[str, Any], types: Mapping[str, str], key: str) -> TypedValue | None:
    if key not in arguments:
        return None
    value = arguments[key]
    return (types.get(key) or infer_type(value), value)


def assert_args_equivalent(
    current: tuple[Mapping[str, Any], Mapping[str, str]],
    received: tuple[Mapping[str, Any], Mapping[str, str]],
    resource: str,
    keys: tuple[str, ...],
) -> None:
    """rabbit_misc:assert_args_equivalence/4 over ``keys`` (arguments, argument_types)."""
    for key in keys:
        old, new = _lookup(*current, key), _lookup(*received, key)
        if old is None and new is None:
            continue
        if old is not None and new is not None:
            same_class = type_class(old[0]) == type_class(new[0])
            if same_class and erlang_term(old[1]) == erlang_term(new[1]):
                continue
            # RabbitMQ reports bare values when both sides are present...
            raise _inequivalent(key, resource, _describe(new[1], False), _describe(old[1], False))
        if key == QUEUE_TYPE_ARG and (old or new) == ("longstr", DEFAULT_QUEUE_TYPE):
            continue  # a classic queue may lack x-queue-type (rabbitmq-common#341)
        # ...and typed ones when one side is missing.
        raise _inequivalent(
            key, resource, _describe(new, new is not None), _describe(old, old is not None)
        )


def assert_exchange_equivalent(current: ExchangeDef, requested: ExchangeDef) -> None:
    """rabbit_exchange:assert_equivalence/6."""
    resource = resource_name("exchange", current.name, current.vhost)
    assert_field_equivalent(current.type, requested.type, resource, "type")
    assert_field_equivalent(current.durable, requested.durable, resource, "durable")
    assert_field_equivalent(current.auto_delete, requested.auto_delete, resource, "auto_delete")
    assert_field_equivalent(current.internal, requested.internal, resource, "internal")
    assert_args_equivalent(
        (current.arguments, current.argument_types),
        (requested.arguments, requested.argument_types),
        resource,
        EXCHANGE_EQUIVALENCE_ARGUMENTS,
    )


def queue_type_of(queue: QueueDef) -> str:
    declared = queue.arguments.get(QUEUE_TYPE_ARG)
    if not isinstance(declared, str) or declared in ("", "undefined"):
        return DEFAULT_QUEUE_TYPE
    return declared


def assert_queue_equivalent(current: QueueDef, requested: QueueDef) -> None:
    """rabbit_amqqueue:perform_full_equivalence_checks/5; ``requested`` is augmented."""
    check_exclusive_access(current, requested.exclusive_owner, strict=True)
    resource = resource_name("queue", current.name, current.vhost)
    assert_field_equivalent(current.durable, requested.durable, resource, "durable")
    assert_field_equivalent(current.auto_delete, requested.auto_delete, resource, "auto_delete")
    keys = QUEUE_TYPE_ARGUMENTS.get(queue_type_of(current), QUEUE_TYPE_ARGUMENTS["classic"])
    assert_args_equivalent(
        (current.arguments, current.argument_types),
        (requested.arguments, requested.argument_types),
        resource,
        keys,
    )


def check_exchange_name_arg(
    arguments: Mapping[str, Any], types: Mapping[str, str], key: str, resource: str
) -> None:
    """rabbit_misc:r_arg/4 as used for alternate-exchange and x-dead-letter-exchange."""
    typed = _lookup(arguments, types, key)
    if typed is not None and typed[0] != "longstr":
        raise PreconditionFailed(f"invalid type '{typed[0]}' for arg '{key}' in {resource}")


def split_topic_words(key: str) -> list[str]:
    """rabbit_db_topic_exchange:split_topic_key_binary/1: '' has no words, else split on '.'."""
    return key.split(".") if key else []


def validate_binding(
    exchange: ExchangeDef,
    binding: BindingDef,
    *,
    max_topic_hash_wildcards: int | None = MAX_TOPIC_HASH_WILDCARDS,
) -> None:
    """The exchange type's validate_binding/2 (headers x-match, topic '#' count)."""
    if exchange.type == "headers":
        typed = _lookup(binding.arguments, binding.argument_types, "x-match")
        if typed is None:
            return
        amqp_type, value = typed
        if amqp_type != "longstr":
            raise PreconditionFailed(
                f"Invalid x-match field type {amqp_type} (value {erlang_repr(value)}); "
                "expected longstr"
            )
        if value not in X_MATCH_VALUES:
            raise PreconditionFailed(
                f"Invalid x-match field value {erlang_repr(value)}; "
                "expected all, any, all-with-x, or any-with-x"
            )
    elif exchange.type == "topic" and max_topic_hash_wildcards is not None:
        hashes = split_topic_words(binding.routing_key).count("#")
        if hashes > max_topic_hash_wildcards:
            raise PreconditionFailed(
                f"Topic binding key '{binding.routing_key}' uses {hashes} '#' wildcards, "
                f"at most {max_topic_hash_wildcards} are allowed"
            )


def check_delayed_exchange(definition: ExchangeDef) -> None:
    """rabbitmq-delayed-message-exchange's validate/1, run when such an exchange is created:
    ``x-delayed-type`` must name another, existing exchange type."""
    value = definition.arguments.get("x-delayed-type")
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if value == DELAYED_MESSAGE_EXCHANGE_TYPE:
        raise PreconditionFailed(
            "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'"
        )
    if not isinstance(value, str):
        raise PreconditionFailed(
            "Invalid argument, 'x-delayed-type' must be an existing exchange type"
        )
    if value not in BUILTIN_EXCHANGE_TYPES:
        raise CommandInvalid(f"unknown exchange type '{value}'")
