"""A channel holding unacked deliveries, for the tests of what acks take off it."""

from __future__ import annotations

from typing import Any, cast

from gateway.sessions.channel_state import ChannelState, Delivery


def channel_with_deliveries(count: int) -> ChannelState:
    """Channel 1 with ``count`` deliveries out, tags 1..count (each delivery's partition is
    its tag, so a test can tell them apart)."""
    channel = ChannelState(1, session=cast(Any, None))
    for _ in range(count):
        tag = channel.take_tag()
        channel.unacked[tag] = Delivery(cast(Any, None), tag, cast(Any, None), None)
    return channel
