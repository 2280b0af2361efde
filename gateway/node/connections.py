"""What the node does to its open client connections as a whole: admit a new socket or not
(``max_connections_per_address``), close the connections of a deleted vhost, and cancel the
consumers of a deleted queue (telling the clients that can hear it, as RabbitMQ does). Each
is a function of the connections it is handed; the node holds them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import cast

from pamqp import commands

from gateway.amqp.errors import ConnectionForced
from gateway.queues.runtime import QueueRuntime
from gateway.sessions.channel_state import Consumer
from gateway.sessions.session import Session
from gateway.vhost import VirtualHost

log = logging.getLogger("mqgw.node")


def admits(sessions: Iterable[Session], session: Session, cap: int) -> bool:
    """max_connections_per_address: refuse a socket from an address already at the cap
    (before the handshake, so it costs nothing; RabbitMQ has no such cap built in)."""
    if not cap:
        return True
    host = session.peer.rsplit(":", 1)[0]
    count = sum(1 for s in sessions if s.peer.rsplit(":", 1)[0] == host)
    if count < cap:
        return True
    log.warning(
        "refusing connection from %s: %d connections from this address (the cap)", host, cap
    )
    return False


async def close_vhost_sessions(
    sessions: Iterable[Session], name: str, vhost: VirtualHost | None
) -> None:
    """Close the connections open on the deleted vhost ``name`` with 320."""
    error = ConnectionForced(f"vhost '{name}' is deleted")
    for session in list(sessions):
        if session.vhost is vhost:
            session.conn.close(error)
            session.mark_dirty()
            await session.release()


def cancel_consumers(queue: QueueRuntime) -> None:
    """Consumers of a deleted queue are cancelled; clients that can hear it are told."""
    # The queue layer holds them as QueueConsumers; the node made them, as Consumers.
    for consumer in cast(list[Consumer], list(queue.consumers)):
        session = consumer.channel.session
        session.cancel_consumer(consumer)
        if session.conn.consumer_cancel_notify:
            cancel = commands.Basic.Cancel(consumer_tag=consumer.tag, nowait=True)
            session.conn.send_method(consumer.channel.number, cancel)
            session.mark_dirty()
