"""The consumer timeout: a channel holding a delivery unacked past its queue's
``consumer_timeout`` (x-consumer-timeout, a policy, else the node's) is closed with 406
PRECONDITION_FAILED and its deliveries are requeued, as RabbitMQ does. These functions look
at the open connections they are handed; the node runs ``run`` as one of its tasks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import anyio

from gateway.amqp.errors import PreconditionFailed
from gateway.config.settings import GatewaySettings
from gateway.queues.clock import Clock
from gateway.sessions.channel_state import ChannelState
from gateway.sessions.session import Session

log = logging.getLogger("mqgw.node")


async def run(sessions: Iterable[Session], settings: GatewaySettings, clock: Clock) -> None:
    """Close channels holding a delivery unacked past its queue's consumer timeout."""
    shortest = float(settings.consumer_timeout_ms)
    while True:
        try:
            shortest = await fail_timed_out(
                sessions, settings.consumer_timeout_ms, clock.monotonic()
            )
        except Exception:
            log.exception("consumer timeout check failed")
        await anyio.sleep(min(1.0, max(0.01, shortest / 4000)))


async def fail_timed_out(sessions: Iterable[Session], default: int, now: float) -> float:
    """Fail the channels that timed out; returns the shortest timeout in use (ms)."""
    shortest = float(default)
    timed_out: list[tuple[Session, ChannelState, int, int]] = []
    for session in sessions:
        for channel in session.channels.values():
            for tag, delivery in channel.unacked.items():
                timeout = delivery.queue.behaviour.consumer_timeout_ms or default
                shortest = min(shortest, timeout)
                if now - delivery.at > timeout / 1000:
                    timed_out.append((session, channel, timeout, tag))
                    break
                if now - delivery.at < shortest / 1000:
                    break  # later deliveries are younger still
    for session, channel, timeout, tag in timed_out:
        await _time_out(session, channel, timeout, tag)
    return shortest


async def _time_out(session: Session, channel: ChannelState, timeout_ms: int, tag: int) -> None:
    if channel.closing or session.channels.get(channel.number) is not channel:
        return
    log.warning(
        "connection %s: channel %d: delivery %d was not acknowledged within %d ms "
        "(consumer timeout): closing the channel, its deliveries are requeued",
        session.id,
        channel.number,
        tag,
        timeout_ms,
    )
    error = PreconditionFailed(
        f"delivery acknowledgement on channel {channel.number} timed out. Timeout value "
        f"used: {timeout_ms} ms. This timeout value can be configured, see consumers doc "
        "guide to learn more"
    )
    await session.fail(channel, error)
    session.mark_dirty()
