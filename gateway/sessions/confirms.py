"""Publisher confirms: what a batch leaves for the confirm pipeline, and how it is sent.

``publish_batch`` queues one ``ConfirmItem`` per batch; ``Session.confirm_loop`` waits until
the item's end offset is durable and hands the tags to ``send_confirms``, which coalesces
them into runs per channel as rabbit_channel does, so a client sees few frames for many
publishes and every ack or nack after those before it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.sessions.channel_state import ChannelState

if TYPE_CHECKING:
    from gateway.amqp import ServerConnection
    from gateway.observe.stats import NodeStats

# (channel, tag, accepted) per publish, the batch's end offset, whether the store took it.
ConfirmTag = tuple[ChannelState, int, bool]
ConfirmItem = tuple[list[ConfirmTag], int, bool]


def send_confirms(
    conn: ServerConnection, stats: NodeStats, tags: list[ConfirmTag], stored: bool
) -> None:
    """Runs of acks or nacks per channel, each sent once for its last tag.

    As rabbit_channel does: a lone ack has multiple=false; a run of acks, and any nack
    (sent when every earlier tag is settled), have multiple=true.
    """
    runs: dict[ChannelState, tuple[bool, int, int]] = {}  # channel -> (ack?, first, last)
    for channel, tag, accepted in tags:
        ack = stored and accepted
        run = runs.get(channel)
        if run is not None and run[0] != ack:
            _send_confirm_run(conn, stats, channel, *run)
            run = None
        runs[channel] = (ack, tag if run is None else run[1], tag)
    for channel, run in runs.items():
        _send_confirm_run(conn, stats, channel, *run)


def _send_confirm_run(
    conn: ServerConnection,
    stats: NodeStats,
    channel: ChannelState,
    ack: bool,
    first: int,
    last: int,
) -> None:
    if ack:
        stats.confirm += last - first + 1
        conn.send_ack(channel.number, last, last != first)
    else:
        conn.send_nack(channel.number, last, True)
