"""Flow control of a publishing connection: when it is not read again for a while.

After a batch is appended, the connection is held (not read: its TCP window closes, its
state is "flow") while its publish rate is over a throttle, while a ``block`` depth breaker
on a queue it wrote to is tripped, or, bounded by ``FLOW_WAIT_MAX_S``, while such a queue is
far behind its consumers, here or on the gateway that delivers it. Nothing is refused or
lost, as with RabbitMQ's credit flow. The connection is seen through ``HeldConnection``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import anyio

if TYPE_CHECKING:
    from gateway.amqp import Publish
    from gateway.queues.rate_limit import Limits
    from gateway.queues.runtime import QueueRuntime
    from gateway.sessions.host import SessionHost

FLOW_WAIT_MAX_S = 1.0


class HeldConnection(Protocol):
    """What flow control reads and counts on a session."""

    flow_holds: int  # holds in progress: the connection's state is "flow" while above 0

    @property
    def node(self) -> SessionHost: ...
    @property
    def publish_limits(self) -> Limits | None: ...


async def hold_for_publish_rate(session: HeldConnection, batch: list[Publish]) -> None:
    """Publish limits: the batch is paid for, and the connection is not read again until
    every bucket in scope has a token (its TCP window closes, as with RabbitMQ's credit
    flow: nothing refused or lost; its state is "flow" meanwhile)."""
    limits = session.publish_limits
    assert limits is not None
    limits.take_publishes(len(batch), sum(len(p.body) for p in batch))
    if limits.ready():
        return
    session.flow_holds += 1
    try:
        while not limits.ready() and limits is session.publish_limits:
            await anyio.sleep(max(0.0, limits.next_at() - limits.clock()))
    finally:
        session.flow_holds -= 1


async def hold_for_queues(session: HeldConnection, woken: set[QueueRuntime]) -> None:
    """After an append, for each queue written to: its breaker judged, then a hold while it
    is congested here or (another gateway delivering it) behind on the broker."""
    node = session.node
    for queue in woken:
        if queue.breaker is not None:
            await _judge_breaker(session, queue)
        if queue.congested():
            node.stats.flow_holds_local += 1
            await _wait_for_consumers(session, queue)
        elif (
            node.remote_backlog is not None
            and not queue.holds_all_leases()  # another gateway delivers: ask the broker
            and await node.remote_backlog.hold(queue, FLOW_WAIT_MAX_S)
        ):
            node.stats.flow_holds_remote += 1


async def _judge_breaker(session: HeldConnection, queue: QueueRuntime) -> None:
    """A depth breaker is judged after every append to its queue; a tripped ``block``
    one holds this connection (not read: its state is "flow") until it resets."""
    await session.node.breakers.judge(queue)
    breaker = queue.breaker
    if breaker is None or not (breaker.tripped and breaker.blocks):
        return
    session.flow_holds += 1
    try:
        await breaker.reset_signal().wait()
    finally:
        session.flow_holds -= 1


async def _wait_for_consumers(session: HeldConnection, queue: QueueRuntime) -> None:
    """Flow control: this connection is not read while a queue it publishes to is far
    behind its consumers (its TCP window closes, the publisher slows down), as RabbitMQ's
    credit flow does. Bounded, so a stuck queue cannot hold a publisher for good."""
    session.flow_holds += 1
    try:
        with anyio.move_on_after(FLOW_WAIT_MAX_S):
            await queue.caught_up_signal().wait()
    finally:
        session.flow_holds -= 1
