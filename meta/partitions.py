"""How many log partitions a new queue gets, and the rules on mqgw's partition settings.

A queue's partitions are fixed when it is created: its ``x-mqgw-partitions`` argument, else
the ``partitions`` key of the policy in force for it, else the node's ``queue_partitions``;
a stream has one (one offset sequence). Later policy changes leave the count alone.
Gray partitions (``x-mqgw-gray-partitions`` / policy ``gray-partitions``, K) must leave a
normal one, K < partitions, and only a classic FIFO queue has them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard

from meta.autoscale_policy import AUTOSCALE_KEY, AutoscaleInvalid, parse_autoscale
from meta.breaker_policy import BREAKER_KEY, BreakerInvalid, parse_breaker
from meta.checks import DEFAULT_QUEUE_TYPE, queue_type_of
from meta.group_pins import GROUPS_KEY, PinInvalid, parse_groups
from meta.models import Policy, QueueDef

PARTITIONS_ARG = "x-mqgw-partitions"
GRAY_PARTITIONS_ARG = "x-mqgw-gray-partitions"
PARTITIONS_KEY = "partitions"  # policy keys
GRAY_PARTITIONS_KEY = "gray-partitions"
MAX_PARTITIONS = 256
STREAM = "stream"


class PolicyInvalid(ValueError):
    """A policy's definition breaks a partition rule (the management API's 400)."""


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _in_range(value: Any) -> TypeGuard[int]:
    return _is_int(value) and 1 <= value <= MAX_PARTITIONS


def policy_in_force(policies: Iterable[Policy], queue_name: str) -> Policy | None:
    """The highest priority of the policies that match the queue (ties: the last name)."""
    matching = [p for p in policies if p.applies_to_queue(queue_name)]
    return max(matching, key=lambda p: (p.priority, p.name), default=None)


def initial_partitions(queue: QueueDef, policy: Mapping[str, Any] | None, default: int) -> int:
    """The partitions of ``queue`` if it is created now. An invalid argument falls through
    here: queue.declare's checks (meta/queue_arguments.py) refuse it on creation."""
    if queue_type_of(queue) == STREAM:
        return 1
    argument = queue.arguments.get(PARTITIONS_ARG)
    if _in_range(argument):
        return argument
    from_policy = (policy or {}).get(PARTITIONS_KEY)
    return from_policy if _in_range(from_policy) else default


def gray_refusal(queue: QueueDef) -> str | None:
    """Why ``queue`` cannot have gray partitions (it is no classic FIFO queue), or None."""
    queue_type = queue_type_of(queue)
    if queue_type != DEFAULT_QUEUE_TYPE:
        return f"x-queue-type {queue_type}"
    arguments = queue.arguments
    if "x-max-priority" in arguments:
        return "x-max-priority"
    if arguments.get("x-single-active-consumer") is True:
        return "x-single-active-consumer"
    if arguments.get("x-consume-mode") == "broadcast":
        return "x-consume-mode broadcast"
    return None


def check_policy_definition(definition: Mapping[str, Any]) -> None:
    """The partition keys (and the depth breaker) of a policy's definition, on their own."""
    try:
        if BREAKER_KEY in definition:
            parse_breaker(definition[BREAKER_KEY])
        if AUTOSCALE_KEY in definition:
            parse_autoscale(definition[AUTOSCALE_KEY])
        if GROUPS_KEY in definition:
            parse_groups(definition[GROUPS_KEY])
    except (BreakerInvalid, AutoscaleInvalid, PinInvalid) as error:
        raise PolicyInvalid(str(error)) from None
    partitions = definition.get(PARTITIONS_KEY)
    if PARTITIONS_KEY in definition and not _in_range(partitions):
        raise PolicyInvalid(
            f"policy key '{PARTITIONS_KEY}' must be an integer from 1 to {MAX_PARTITIONS}, "
            f"not {partitions!r}"
        )
    if GRAY_PARTITIONS_KEY not in definition:
        return
    gray = definition[GRAY_PARTITIONS_KEY]
    if not _is_int(gray) or gray < 0:
        raise PolicyInvalid(
            f"policy key '{GRAY_PARTITIONS_KEY}' must be a non-negative integer, not {gray!r}"
        )
    if partitions is not None and gray >= partitions:
        raise PolicyInvalid(
            f"{GRAY_PARTITIONS_KEY} {gray} needs more than {partitions} partitions "
            f"({PARTITIONS_KEY}): a queue keeps at least one normal partition"
        )


def check_policy_on_queues(policy: Policy, queues: Iterable[QueueDef]) -> None:
    """The policy's gray-partitions against the existing queues it would give them to:
    those it matches that take gray partitions and have no argument of their own."""
    gray = policy.definition.get(GRAY_PARTITIONS_KEY)
    if not _is_int(gray) or gray <= 0:
        return
    for queue in queues:
        if (
            policy.applies_to_queue(queue.name)
            and GRAY_PARTITIONS_ARG not in queue.arguments
            and gray_refusal(queue) is None
            and gray >= queue.partitions
        ):
            raise PolicyInvalid(
                f"{GRAY_PARTITIONS_KEY} {gray} needs more than the {queue.partitions} "
                f"partitions of queue '{queue.name}', which the policy matches"
            )


def check_policy(policy: Policy, queues: Iterable[QueueDef]) -> None:
    """A policy about to be set in a vhost holding ``queues``."""
    check_policy_definition(policy.definition)
    check_policy_on_queues(policy, queues)
