"""Per-queue partitions without servers: how a new queue's count is chosen, the declare-time
checks of x-mqgw-partitions / x-mqgw-gray-partitions, the policy checks, and a definitions
import choosing counts as queue.declare does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meta.checks import assert_queue_equivalent
from meta.definitions import DefinitionsError, parse_definitions
from meta.definitions_plan import plan_import
from meta.errors import PreconditionFailed
from meta.local_store import LocalMetadataStore
from meta.models import Policy, QueueDef
from meta.partitions import (
    PolicyInvalid,
    check_policy,
    initial_partitions,
    policy_in_force,
)
from meta.queue_arguments import check_queue_arguments
from meta.state import augment_queue_arguments


def queue(partitions: int = 1, name: str = "q", **arguments: Any) -> QueueDef:
    """A declared queue; quorum and stream ones must be durable."""
    args = {k.replace("_", "-"): v for k, v in arguments.items()}
    return augment_queue_arguments(
        QueueDef(vhost="/", name=name, arguments=args, partitions=partitions, durable=True)
    )


def policy(definition: dict[str, Any], pattern: str = "^q", priority: int = 0) -> Policy:
    fields = {"pattern": pattern, "definition": definition, "priority": priority}
    return Policy.model_validate({"vhost": "/", "name": f"p{priority}", **fields})


# --- choosing the count ------------------------------------------------------------------


def test_argument_then_policy_then_node_default() -> None:
    assert initial_partitions(queue(x_mqgw_partitions=4), {"partitions": 3}, 2) == 4
    assert initial_partitions(queue(), {"partitions": 3}, 2) == 3
    assert initial_partitions(queue(), {"max-length": 3}, 2) == 2
    assert initial_partitions(queue(), None, 2) == 2
    # Invalid values fall through (the argument is refused later, on creation).
    assert initial_partitions(queue(x_mqgw_partitions="4"), {"partitions": 0}, 2) == 2
    assert initial_partitions(queue(x_mqgw_partitions=True), None, 2) == 2


def test_a_stream_has_one_partition() -> None:
    stream = queue(x_queue_type="stream")
    assert initial_partitions(stream, {"partitions": 8}, 4) == 1


def test_the_highest_priority_matching_policy_is_in_force() -> None:
    low, high = policy({}, "^q", 1), policy({}, "^q", 5)
    other = policy({}, "^z", 9)
    assert policy_in_force([low, high, other], "q1") is high
    assert policy_in_force([other], "q1") is None


# --- queue.declare checks ----------------------------------------------------------------


def refusal(definition: QueueDef) -> str:
    with pytest.raises(PreconditionFailed) as refused:
        check_queue_arguments(definition)
    return refused.value.detail


PREFIX = "invalid arg '{}' for queue 'q' in vhost '/': "


@pytest.mark.parametrize(
    ("value", "term"),
    [(0, "{value_zero,0}"), (-2, "{value_negative,-2}"), (257, "{value_too_large,257,256}"),
     ("4", '"expected integer, got longstr"'), (True, '"expected integer, got bool"')],
)  # fmt: skip
def test_partitions_out_of_range_or_not_an_integer(value: Any, term: str) -> None:
    text = refusal(queue(x_mqgw_partitions=value))
    assert text == PREFIX.format("x-mqgw-partitions") + term


def test_partitions_in_range_pass() -> None:
    check_queue_arguments(queue(1, x_mqgw_partitions=1))
    check_queue_arguments(queue(256, x_mqgw_partitions=256))


def test_a_stream_refuses_more_than_one_partition() -> None:
    stream = queue(x_queue_type="stream", x_mqgw_partitions=4)
    assert refusal(stream).endswith("a stream has one partition")


def test_gray_partitions_must_leave_a_normal_one() -> None:
    text = refusal(queue(2, x_mqgw_partitions=2, x_mqgw_gray_partitions=2))
    assert text == PREFIX.format("x-mqgw-gray-partitions") + (
        "x-mqgw-gray-partitions 2 needs more than 2 partitions (x-mqgw-partitions)"
    )
    check_queue_arguments(queue(4, x_mqgw_gray_partitions=2))
    check_queue_arguments(queue(1, x_mqgw_gray_partitions=0))  # none: any count


@pytest.mark.parametrize(
    ("arguments", "named"),
    [({"x_max_priority": 5}, "x-max-priority"),
     ({"x_single_active_consumer": True}, "x-single-active-consumer"),
     ({"x_consume_mode": "broadcast"}, "x-consume-mode broadcast"),
     ({"x_queue_type": "quorum"}, "x-queue-type quorum")],
)  # fmt: skip
def test_gray_partitions_only_on_a_classic_fifo_queue(
    arguments: dict[str, Any], named: str
) -> None:
    definition = queue(4, x_mqgw_gray_partitions=1, **arguments)
    assert refusal(definition).endswith(f"need a classic FIFO queue, not one with {named}")
    check_queue_arguments(queue(4, x_mqgw_gray_partitions=0, **arguments))


def test_gray_partitions_not_an_integer() -> None:
    assert refusal(queue(4, x_mqgw_gray_partitions=-1)).endswith("{value_negative,-1}")
    text = refusal(queue(4, x_mqgw_gray_partitions="x"))
    assert text.endswith('"expected integer, got longstr"')


def test_redeclare_with_other_partitions_is_inequivalent() -> None:
    current = queue(4, x_mqgw_partitions=4)
    assert_queue_equivalent(current, queue(4, x_mqgw_partitions=4))
    with pytest.raises(PreconditionFailed, match="inequivalent arg 'x-mqgw-partitions'"):
        assert_queue_equivalent(current, queue(8, x_mqgw_partitions=8))


# --- policies ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "definition",
    [{"gray-partitions": -1}, {"gray-partitions": "x"}, {"gray-partitions": 1.5},
     {"partitions": 0}, {"partitions": 257}, {"partitions": "3"}, {"partitions": True},
     {"gray-partitions": 1, "partitions": 1}, {"gray-partitions": 3, "partitions": 2}],
)  # fmt: skip
def test_policy_keys_refused(definition: dict[str, Any]) -> None:
    with pytest.raises(PolicyInvalid):
        check_policy(policy(definition), [])


def test_policy_keys_accepted() -> None:
    check_policy(policy({"gray-partitions": 0, "partitions": 1}), [])
    check_policy(policy({"gray-partitions": 2, "partitions": 3, "max-length": 5}), [])


def test_policy_gray_against_the_queues_it_would_apply_to() -> None:
    four = queue(4, "q4", x_mqgw_partitions=4)
    gray4 = policy({"gray-partitions": 4, "partitions": 8})
    with pytest.raises(PolicyInvalid, match="4 partitions of queue 'q4'"):
        check_policy(gray4, [four])
    check_policy(policy({"gray-partitions": 3}), [four])
    # Not matched, its own argument wins, or no gray there at all: not in the way.
    check_policy(policy({"gray-partitions": 4}, "^other"), [four])
    own = queue(4, "q4", x_mqgw_partitions=4, x_mqgw_gray_partitions=1)
    priority = queue(4, "q4", x_max_priority=3)
    check_policy(gray4, [own, priority])


# --- definitions import ------------------------------------------------------------------


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def entry(name: str, **arguments: Any) -> dict[str, Any]:
    args = {k.replace("_", "-"): v for k, v in arguments.items()}
    return {"name": name, "vhost": "/", "durable": True, "auto_delete": False, "arguments": args}


def definitions(**parts: Any) -> bytes:
    return json.dumps(parts).encode()


@pytest.mark.anyio
async def test_import_chooses_partitions_as_declare_does(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path)
    rule = {"name": "p", "vhost": "/", "pattern": "^bypolicy", "definition": {"partitions": 3}}
    body = definitions(
        policies=[rule],
        queues=[entry("bypolicy"), entry("byarg", x_mqgw_partitions=5), entry("plain")],
    )
    plan = await plan_import(parse_definitions(body), store, default_partitions=2)
    assert {q.name: q.partitions for q in plan.queues} == {"bypolicy": 3, "byarg": 5, "plain": 2}


@pytest.mark.anyio
async def test_import_refuses_bad_partition_values(tmp_path: Path) -> None:
    store = LocalMetadataStore(tmp_path)
    await store.declare_queue(QueueDef(vhost="/", name="four", partitions=4))
    bad = {"name": "g", "vhost": "/", "pattern": "^four$", "definition": {"gray-partitions": 4}}
    body = definitions(policies=[bad], queues=[entry("zero", x_mqgw_partitions=0)])
    with pytest.raises(DefinitionsError) as refused:
        await plan_import(parse_definitions(body), store)
    assert refused.value.errors == [
        "policies[0].definition: gray-partitions 4 needs more than the 4 partitions of "
        "queue 'four', which the policy matches",
        "queues[0]: invalid arg 'x-mqgw-partitions' for queue 'zero' in vhost '/': {value_zero,0}",
    ]
