"""Direct tests of the equivalence rules that the store cannot reach on its own."""

import pytest

from meta.checks import assert_args_equivalent, assert_queue_equivalent
from meta.errors import PreconditionFailed
from meta.models import QueueDef


def test_missing_queue_type_equals_classic_both_ways() -> None:
    keys = ("x-queue-type",)
    resource = "queue 'q' in vhost '/'"
    legacy: tuple[dict[str, object], dict[str, str]] = ({}, {})  # e.g. imported definitions
    classic: tuple[dict[str, object], dict[str, str]] = ({"x-queue-type": "classic"}, {})
    assert_args_equivalent(legacy, classic, resource, keys)
    assert_args_equivalent(classic, legacy, resource, keys)
    with pytest.raises(PreconditionFailed) as info:
        assert_args_equivalent(legacy, ({"x-queue-type": "quorum"}, {}), resource, keys)
    assert info.value.detail == (
        "inequivalent arg 'x-queue-type' for queue 'q' in vhost '/': "
        "received the value 'quorum' of type 'longstr' but current is none"
    )


def test_queue_type_selects_compared_arguments() -> None:
    quorum = QueueDef(vhost="/", name="qq", arguments={"x-queue-type": "quorum"})
    # x-max-priority is a classic-only argument: not compared for quorum queues.
    assert_queue_equivalent(
        quorum,
        quorum.model_copy(update={"arguments": {"x-queue-type": "quorum", "x-max-priority": 5}}),
    )
    with pytest.raises(PreconditionFailed, match="'x-delivery-limit'"):
        assert_queue_equivalent(
            quorum,
            quorum.model_copy(
                update={"arguments": {"x-queue-type": "quorum", "x-delivery-limit": 5}}
            ),
        )
    classic = QueueDef(vhost="/", name="cq", arguments={"x-queue-type": "classic"})
    with pytest.raises(PreconditionFailed, match="'x-max-priority'"):
        assert_queue_equivalent(
            classic,
            classic.model_copy(
                update={"arguments": {"x-queue-type": "classic", "x-max-priority": 5}}
            ),
        )


def test_reply_text_format() -> None:
    error = PreconditionFailed("x")
    assert (error.reply_code, error.reply_text) == (406, "PRECONDITION_FAILED - x")
