"""A vhost's max-connections at connection.open (meta/vhost_limits.py), over every gateway.

The connection is counted in the metadata store under its "<gateway>/<n>" id (a Redis set per
vhost in a cluster) against the limit this gateway's cache holds (kept by the change feed);
one over the limit is refused with RabbitMQ's 530 text. When the store cannot be reached the
connection is let in uncounted (as logins go on against the users the gateway knows) and the
log says so; a close the store missed is retried by the node's housekeeping.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gateway.amqp.errors import NotAllowed
from meta.errors import MetadataUnavailable
from meta.vhost_limits import MAX_CONNECTIONS, connection_limit_reached, limit_of

if TYPE_CHECKING:
    from gateway.sessions.session import Session

log = logging.getLogger("mqgw.session")


async def count_in(session: Session, vhost: str) -> NotAllowed | None:
    """Count ``session`` as open in ``vhost``; the error to refuse it with if at the limit."""
    limit = limit_of(session.node.vhost_limits.get(vhost), MAX_CONNECTIONS)
    try:
        admitted = await session.node.meta.open_connection(vhost, session.owner_id, limit)
    except MetadataUnavailable as error:
        log.warning("connection %s: not counted against vhost limits: %s", session.id, error)
        return None
    if not admitted:
        assert limit is not None
        refused = NotAllowed(connection_limit_reached(vhost, session.user, limit).detail)
        log.warning("connection %s: %s", session.id, refused.reply_text)
        return refused
    session.counted_in = vhost
    return None


async def count_out(session: Session) -> None:
    """The connection is over: no longer counted (later, if the store is away now)."""
    vhost, session.counted_in = session.counted_in, None
    if vhost is None:
        return
    try:
        await session.node.meta.close_connection(vhost, session.owner_id)
    except MetadataUnavailable:
        session.node.connections_to_uncount.add((vhost, session.owner_id))
