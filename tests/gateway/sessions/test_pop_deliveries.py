"""ChannelState.pop_deliveries against the rule it implements: an ack names one tag, or with
``multiple`` every outstanding tag up to it (0: all of them), whatever acks came before."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.gateway.sessions.channels import channel_with_deliveries


@given(
    count=st.integers(0, 40),
    acks=st.lists(st.tuples(st.integers(0, 45), st.booleans()), max_size=12),
)
def test_an_ack_takes_exactly_the_tags_it_names(count: int, acks: list[tuple[int, bool]]) -> None:
    channel = channel_with_deliveries(count)
    outstanding = list(range(1, count + 1))
    for tag, multiple in acks:
        if multiple:
            named = [t for t in outstanding if tag == 0 or t <= tag]
        else:
            named = [t for t in outstanding if t == tag]
        taken = channel.pop_deliveries(tag, multiple)
        assert [delivery.partition for delivery in taken] == named  # partition holds the tag
        outstanding = [t for t in outstanding if t not in named]
        assert list(channel.unacked) == outstanding
