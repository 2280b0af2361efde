"""What every channel-method handler uses: the session's vhost, the reply unless nowait.

Also the small rules RabbitMQ applies across methods: '' as the channel's last declared
queue, CR/LF stripped from names, the exclusive-queue check, the wire types the frame decoder
recorded for ``arguments``. The handlers themselves are in topology_methods.py (exchange and
queue), basic_methods.py (basic) and handlers.py (channel, confirm, tx and the dispatch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pamqp import base

from gateway.amqp.errors import NotFound
from gateway.queues.runtime import QueueRuntime
from gateway.sessions.channel_state import ChannelState
from gateway.vhost import VirtualHost, amqp_error
from meta import checks
from meta.errors import MetaError

if TYPE_CHECKING:
    from gateway.sessions.session import Session


def vhost_of(session: Session) -> VirtualHost:
    assert session.vhost is not None
    return session.vhost


def send_method(
    session: Session, channel: ChannelState, method: base.Frame, nowait: bool = False
) -> None:
    if not nowait:
        session.conn.send_method(channel.number, method)


def argument_types(method: Any) -> dict[str, str]:
    """Wire types of ``arguments`` as the frame decoder recorded them (see amqp/methods.py)."""
    return dict(getattr(method, "argument_types", None) or {})


def strip_cr_lf(method: Any, *fields: str) -> None:
    """rabbit_channel:strip_cr_lf/1: CR and LF are dropped from the names queue.declare,
    queue.delete, exchange.declare, exchange.delete and the bind methods carry (but not
    from those of basic.get, consume, publish or queue.purge)."""
    for name in fields:
        value = getattr(method, name)
        if "\n" in value or "\r" in value:
            setattr(method, name, value.replace("\n", "").replace("\r", ""))


def queue_name_or_last(channel: ChannelState, name: str, class_id: int, method_id: int) -> str:
    """'' means the channel's most recently declared queue, as in RabbitMQ."""
    if name:
        return name
    if not channel.last_queue:
        raise NotFound("no previously declared queue", class_id, method_id)
    return channel.last_queue


def exclusive_check(session: Session, queue: QueueRuntime, class_id: int, method_id: int) -> None:
    try:
        checks.check_exclusive_access(queue.definition, session.owner_id)
    except MetaError as error:
        raise amqp_error(error, class_id, method_id) from None
