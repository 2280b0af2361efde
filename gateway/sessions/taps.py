"""A session's tap: what its publishes and deliveries report while its vhost's firehose
(gateway/observe/firehose.py) or the node's OpenTelemetry tracing (gateway/observe/tracing.py)
is on.

``Session.tap`` is None otherwise, and every hook on the message path is one
``if session.tap is not None`` — off, tracing costs a test of a plain attribute. Turning the
firehose on or off (the admin API, the change feed in a cluster) gives the vhost's open
sessions a new tap at once, as RabbitMQ refreshes its channels' trace state.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gateway.observe.firehose import TRACE_EXCHANGE, Firehose
from storage import Record, StoredMessage

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from gateway.amqp import Publish
    from gateway.observe.tracing import Tracing
    from gateway.queues.runtime import QueueRuntime
    from gateway.sessions.channel_state import ChannelState, Delivery
    from gateway.sessions.host import SessionHost
    from gateway.sessions.session import Session
    from gateway.vhost import VirtualHost

log = logging.getLogger("mqgw.trace")

MAX_OPEN_SPANS = 100_000  # per session: spans waiting for a confirm or an ack
_TRACE_EXCHANGE_BYTES = TRACE_EXCHANGE.encode()


class SessionTap:
    def __init__(
        self, session: Session, firehose: Firehose | None, tracing: Tracing | None
    ) -> None:
        self.session = session
        self.firehose = firehose
        self.tracing = tracing
        self._stored: list[Span] = []  # publish spans that end once their batch is appended
        self._confirming: dict[tuple[ChannelState, int], Span] = {}  # end at the confirm
        self._delivering: dict[Delivery, Span] = {}  # end at the ack / nack / reject

    # -- publishing -----------------------------------------------------------------------

    def published(
        self,
        channel: ChannelState,
        publish: Publish,
        record: Record | None,
        queues: list[QueueRuntime],
        now_ms: int,
    ) -> Record | None:
        """A publish was routed (``queues``, maybe none); returns the record to store."""
        routed = record is not None and bool(queues)
        if self.firehose is not None:
            session = self.session
            self.firehose.published(
                session.name,
                session.user,
                channel.number,
                publish.exchange,
                publish.routing_key,
                publish.properties_bytes,  # as sent: BCC still there for routing_keys
                publish.body,
                (queue.name for queue in queues),
            )
        tracing = self.tracing
        if tracing is None:
            return record
        properties = publish.properties_bytes if record is None else record.properties
        span = tracing.start_publish(
            publish.exchange, publish.routing_key, properties, len(publish.body), now_ms * 10**6
        )
        span.set_attribute("messaging.rabbitmq.routed", routed)
        if channel.confirm_mode and len(self._confirming) < MAX_OPEN_SPANS:
            self._confirming[(channel, channel.next_publish_tag)] = span
        else:
            self._stored.append(span)
        if routed and record is not None:
            injected = tracing.inject(span, record.properties)
            if injected is not None:
                return record._replace(properties=injected)
        return record

    def stored(self, ok: bool) -> None:
        """The batch was appended (or failed): spans of publishes without confirms end."""
        spans, self._stored = self._stored, []
        for span in spans:
            if not ok:
                span.add_event("store failed")
            span.end()

    def confirmed(self, tags: Iterable[tuple[ChannelState, int, bool]], stored: bool) -> None:
        """Confirms went out for ``tags``: their publish spans end with the outcome."""
        for channel, tag, accepted in tags:
            span = self._confirming.pop((channel, tag), None)
            if span is not None:
                span.add_event("ack" if stored and accepted else "nack")
                span.end()

    # -- delivering -----------------------------------------------------------------------

    def delivered(
        self,
        channel: ChannelState,
        queue: QueueRuntime,
        message: StoredMessage,
        redelivered: bool,
        tag: int,
    ) -> StoredMessage:
        """A delivery (consumer or basic.get) was booked as ``tag``; returns the message to
        send (with the deliver span's traceparent when traced)."""
        if self.firehose is not None:
            session = self.session
            self.firehose.delivered(
                session.name, session.user, channel.number, queue.name, message, redelivered
            )
        tracing = self.tracing
        if tracing is None or message.exchange == _TRACE_EXCHANGE_BYTES:
            return message
        span = tracing.start_deliver(
            queue.name,
            message.exchange.decode(),
            message.routing_key.decode(),
            message.properties,
            len(message.body),
            redelivered,
            tag,
        )
        delivery = channel.unacked.get(tag)
        if delivery is None or delivery.message is not message:
            span.add_event("ack", {"messaging.rabbitmq.auto_ack": True})  # no-ack: settled
            span.end()
        elif len(self._delivering) < MAX_OPEN_SPANS:
            self._delivering[delivery] = span
        else:
            span.end()
        injected = tracing.inject(span, message.properties)
        if injected is None:
            return message
        return message._replace(properties=memoryview(injected))

    def settled(self, deliveries: Iterable[Delivery], requeue: bool | None) -> None:
        """Ack (requeue None), nack/reject (requeue True or False) of ``deliveries``."""
        if not self._delivering:
            return
        for delivery in deliveries:
            span = self._delivering.pop(delivery, None)
            if span is None:
                continue
            if requeue is None:
                span.add_event("ack")
            else:
                span.add_event("nack", {"messaging.rabbitmq.requeue": requeue})
            span.end()

    def close(self) -> None:
        """The tap is replaced or the session ends: what is still open ends now."""
        self.stored(True)
        for span in [*self._confirming.values(), *self._delivering.values()]:
            span.end()
        self._confirming.clear()
        self._delivering.clear()


def session_tap(session: Session) -> SessionTap | None:
    """The tap a session of its vhost needs now (None: nothing is traced)."""
    vhost = session.vhost
    firehose = None if vhost is None else vhost.firehose
    tracing = session.node.tracing
    if firehose is None and tracing is None:
        return None
    return SessionTap(session, firehose, tracing)


async def set_firehose(node: SessionHost, vhost: VirtualHost, on: bool) -> None:
    """Turn the vhost's firehose on or off here (idempotent: the change feed repeats)."""
    if on == (vhost.firehose is not None):
        return
    old = vhost.firehose
    vhost.firehose = Firehose(vhost, node.name) if on else None
    log.info("%s tracing for vhost '%s'", "Enabling" if on else "Disabling", vhost.name)
    for session in list(node.sessions):
        if session.vhost is vhost:
            if session.tap is not None:
                session.tap.close()
            session.tap = session_tap(session)
    if old is not None:
        await old.flush()  # copies made before the switch still go out


async def restore_firehose(node: SessionHost, vhost: VirtualHost) -> None:
    """A vhost opened (start, created, adopted from the cluster): its stored flag applies."""
    definition = await node.meta.get_vhost(vhost.name)
    await set_firehose(node, vhost, definition is not None and definition.tracing)
