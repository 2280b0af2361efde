"""basic_acks (a run of single acks on one channel) settles what basic_ack one after the
other would: every delivery the acks before an unknown tag name, in one settle, before the
unknown tag's 406 is raised; nothing after it. In tx mode each ack is held for the commit."""

from __future__ import annotations

from typing import Any, cast

import anyio
import pytest
from pamqp import commands

from gateway.amqp.errors import PreconditionFailed
from gateway.sessions.basic_methods import basic_acks
from gateway.sessions.channel_state import ChannelState, Delivery
from tests.gateway.sessions.channels import channel_with_deliveries


class SettleLog:
    def __init__(self) -> None:
        self.settled: list[tuple[list[int], bool | None]] = []

    def settle(self, channel: ChannelState, deliveries: list[Delivery], requeue: Any) -> None:
        self.settled.append(([d.partition for d in deliveries], requeue))


def _acks(*tags: int, multiple: bool = False) -> list[commands.Basic.Ack]:
    return [commands.Basic.Ack(tag, multiple) for tag in tags]


def test_acks_before_an_unknown_tag_are_settled_then_406() -> None:
    session, channel = SettleLog(), channel_with_deliveries(5)
    with pytest.raises(PreconditionFailed, match="unknown delivery tag 9") as raised:
        anyio.run(basic_acks, cast(Any, session), channel, _acks(2, 1, 9, 3))
    assert (raised.value.class_id, raised.value.method_id) == (60, 80)
    assert session.settled == [([2, 1], None)]  # one settle, the tags in the acks' order
    assert sorted(channel.unacked) == [3, 4, 5]  # the ack after the unknown tag is dropped


def test_a_run_of_known_acks_is_one_settle() -> None:
    session, channel = SettleLog(), channel_with_deliveries(6)
    anyio.run(basic_acks, cast(Any, session), channel, [*_acks(4, 1), *_acks(3, multiple=True)])
    assert session.settled == [([4, 1, 2, 3], None)]
    assert sorted(channel.unacked) == [5, 6]


def test_in_tx_mode_each_ack_waits_for_the_commit() -> None:
    session, channel = SettleLog(), channel_with_deliveries(3)
    channel.tx_mode = True
    anyio.run(basic_acks, cast(Any, session), channel, _acks(1, 9))
    assert session.settled == []
    assert [(a.kind, a.delivery_tag) for a in channel.tx_actions] == [("ack", 1), ("ack", 9)]
