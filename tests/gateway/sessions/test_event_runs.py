"""A read's events cut into runs: publishes in a row, acks in a row on one channel, anything
else alone, in the order they came."""

from __future__ import annotations

from typing import Any

from pamqp import commands

from gateway.amqp import ChannelMethod, Publish
from gateway.amqp.events import ChannelOpened
from gateway.sessions.event_runs import PUBLISHES, event_runs


def _publish(channel: int, body: bytes) -> Publish:
    return Publish(channel, "", "q", False, False, b"\x00\x00", body)


def _ack(channel: int, tag: int) -> ChannelMethod:
    return ChannelMethod(channel, commands.Basic.Ack(tag, False))


def _shape(runs: list[tuple[int | None, list[Any]]]) -> list[tuple[int | None, int]]:
    return [(on, len(run)) for on, run in runs]


def test_runs_keep_the_order_and_break_at_every_other_kind() -> None:
    events = [
        _publish(1, b"a"),
        _publish(2, b"b"),  # publishes of any channel make one batch
        _ack(1, 1),
        _ack(1, 2),
        _ack(2, 1),  # another channel: another run
        _ack(2, 2),
        ChannelOpened(3),
        _ack(2, 3),
        ChannelMethod(1, commands.Basic.Nack(3)),  # not an ack: alone
        _publish(1, b"c"),
    ]
    runs = list(event_runs(events))
    assert _shape(runs) == [(PUBLISHES, 2), (1, 2), (2, 2), (None, 1), (2, 1), (None, 1),
                            (PUBLISHES, 1)]  # fmt: skip
    assert [event for _, run in runs for event in run] == events
