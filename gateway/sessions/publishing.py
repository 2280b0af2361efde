"""Route one basic.publish into a store record (or nowhere).

The property bytes are kept verbatim; they are only decoded when a flag bit says a field
that matters here is present (headers for routing and CC/BCC, user-id for its check), so the
common publish pays no decoding.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from gateway.amqp import Publish, frame_writer
from gateway.amqp.errors import (
    AccessRefused,
    AMQPError,
    AMQPNotImplemented,
    NotFound,
    PreconditionFailed,
)
from gateway.amqp.property_bytes import (
    CONTENT_ENCODING,
    CONTENT_TYPE,
    DELIVERY_MODE,
    EXPIRATION,
    HEADERS,
    REPLY_TO,
    USER_ID,
    keep_timestamp,
)
from gateway.features.delayed_exchange import delay_of, hold
from gateway.features.direct_reply import REPLY_PREFIX, REPLY_QUEUE
from gateway.features.gray import marked_gray
from gateway.queues.runtime import QueueRuntime
from gateway.routing import UnknownExchange, strip_bcc
from meta.models import DELAYED_MESSAGE_EXCHANGE_TYPE, ExchangeDef
from storage import Record
from storage.record import EXPIRES, PERSISTENT

if TYPE_CHECKING:
    from gateway.sessions.access import Grants
    from gateway.sessions.channel_state import ChannelState
    from gateway.sessions.host import SessionHost
    from gateway.sessions.taps import SessionTap
    from gateway.vhost import VirtualHost

_FLAGS = struct.Struct(">H")
_make_tuple = tuple.__new__
_LEADING_INTEGER = re.compile(r"[+-]?[0-9]+")
_BEFORE_DELIVERY_MODE = CONTENT_TYPE | CONTENT_ENCODING | HEADERS


class Publisher(Protocol):
    """What routing a publish asks of the session it came on (Session is one)."""

    @property
    def vhost(self) -> VirtualHost | None: ...

    @property
    def grants(self) -> Grants: ...

    @property
    def user(self) -> str: ...

    @property
    def impersonator(self) -> bool: ...

    @property
    def tap(self) -> SessionTap | None: ...

    @property
    def node(self) -> SessionHost: ...


class RouteOutcome(NamedTuple):
    record: Record | None  # what to store (None: nothing)
    queues: list[QueueRuntime]  # to wake after the append
    routed: bool  # False: unroutable (mandatory gets basic.return)
    rejected: bool = False  # a full queue refused it (x-overflow reject-publish): nack
    # Timer records of delayed-message exchanges reached through exchange-to-exchange
    # bindings, each holding a copy (store them with ``record``).
    held: tuple[Record, ...] = ()


UNROUTED = RouteOutcome(None, [], False)
DELIVERED = RouteOutcome(None, [], True)  # handed to a consumer at once, nothing to store


def route_publish(
    session: Publisher, channel: ChannelState, publish: Publish, now_ms: int
) -> RouteOutcome:
    vhost = session.vhost
    assert vhost is not None
    if publish.immediate:
        raise AMQPNotImplemented("immediate=true", 60, 40)
    grants = session.grants  # write on the exchange ("" as amq.default), before its lookup
    if grants.write.get(publish.exchange) is not True:  # a dict read once decided
        grants.require("write", "exchange", publish.exchange, 60, 40)
    exchange = vhost.router.get_exchange(publish.exchange)
    if exchange is None or exchange.internal:
        raise _unusable_exchange(publish.exchange, vhost.name, exchange)
    properties_bytes = publish.properties_bytes
    flags = _FLAGS.unpack_from(properties_bytes)[0] if len(properties_bytes) >= 2 else 0
    headers = None
    if not flags & DELIVERY_MODE:
        delivery_mode = 0
    elif not flags & _BEFORE_DELIVERY_MODE and len(properties_bytes) > 2:
        delivery_mode = properties_bytes[2]  # the first property present: no call
    else:
        delivery_mode = _delivery_mode(properties_bytes, flags)
    if flags & EXPIRATION:
        _check_expiration(publish.properties.expiration)
    if flags & (HEADERS | USER_ID | REPLY_TO) or delivery_mode < 0:
        # Off the common path: this one decodes, and a call is nothing beside the decoding.
        properties_bytes, delivery_mode, headers = _decoded(session, channel, publish, flags)
    if flags & DELIVERY_MODE and delivery_mode not in (1, 2):
        # RabbitMQ's message validation (rabbit_channel): 1 and 2 only, when present.
        raise PreconditionFailed(
            f"invalid message: {{delivery_mode_unknown,{delivery_mode}}}", 60, 40
        )
    delayed = headers is not None and delay_of(headers) is not None
    if delayed and exchange.type == DELAYED_MESSAGE_EXCHANGE_TYPE:
        return _held_by_delayed_exchange(session, publish, headers, delivery_mode, flags, now_ms)
    if not publish.exchange and publish.routing_key.startswith(REPLY_PREFIX):
        return _direct_reply(session, channel, publish, properties_bytes)
    if not publish.exchange and headers is None:
        # The default exchange without CC/BCC: the queue named by the key, or nowhere.
        queue = vhost.queues.get(publish.routing_key)
        if queue is None:
            return UNROUTED
        if (
            queue.plain
            and delivery_mode != 2
            and not flags & EXPIRATION
            and not channel.tx_mode
            and not channel.confirm_mode
            and session.tap is None
            and queue.deliver_now("", publish.routing_key, properties_bytes, publish.body, now_ms)
        ):
            return DELIVERED
        return _record(
            channel, publish, properties_bytes, [queue], delivery_mode, flags, now_ms, None
        )
    try:
        result = vhost.router.route(
            publish.exchange,
            publish.routing_key,
            headers,
            publish.properties_bytes,  # as sent: the headers' wire types
            hold_delayed=delayed,
        )
    except UnknownExchange:
        raise NotFound(
            f"no exchange '{publish.exchange}' in vhost '{vhost.name}'", 60, 40
        ) from None
    by_name = vhost.queues
    queues = [by_name[name] for name in result.ordered if name in by_name]
    outcome = _record(
        channel, publish, properties_bytes, queues, delivery_mode, flags, now_ms, headers
    )
    if result.held_by:
        held = _held_copies(session, publish, headers, delivery_mode, flags, now_ms, result.held_by)
        outcome = outcome._replace(held=held)
    return outcome


def _unusable_exchange(name: str, vhost: str, exchange: ExchangeDef | None) -> AMQPError:
    """The error for a publish to an exchange that is missing or internal."""
    if exchange is None:
        return NotFound(f"no exchange '{name}' in vhost '{vhost}'", 60, 40)
    return AccessRefused(f"cannot publish to internal exchange '{name}' in vhost '{vhost}'", 60, 40)


def _decoded(
    session: Publisher, channel: ChannelState, publish: Publish, flags: int
) -> tuple[bytes, int, Mapping[str, Any] | None]:
    """Properties whose flags say a field that matters here is present (or whose bytes the
    quick reads could not parse), decoded and checked: the property bytes to store (with
    the reply-to rewritten, BCC stripped), the delivery mode and the headers."""
    sent = publish.properties_bytes  # encoded again below: its timestamp bytes kept
    properties_bytes = sent
    properties = publish.properties
    delivery_mode = properties.delivery_mode or 0
    if properties.reply_to == REPLY_QUEUE:
        if not channel.reply_key:
            raise PreconditionFailed("fast reply consumer does not exist", 60, 40)
        properties.reply_to = REPLY_PREFIX + channel.reply_key
        properties_bytes = keep_timestamp(sent, frame_writer.encode_properties(properties))
    headers = properties.headers if flags & HEADERS else None
    user_id = properties.user_id
    if user_id is not None and user_id != session.user and not session.impersonator:
        raise PreconditionFailed(
            f"user_id property set to '{user_id}' but authenticated user was '{session.user}'",
            60,
            40,
        )
    if headers and "BCC" in headers:
        properties.headers = strip_bcc(dict(headers))
        properties_bytes = keep_timestamp(sent, frame_writer.encode_properties(properties))
    return properties_bytes, delivery_mode, headers


def _held_by_delayed_exchange(
    session: Publisher,
    publish: Publish,
    headers: Mapping[str, Any] | None,
    delivery_mode: int,
    property_flags: int,
    now_ms: int,
) -> RouteOutcome:
    """A publish to a delayed-message exchange with an x-delay: its timer record."""
    assert headers is not None
    assert session.vhost is not None
    record_flags = _record_flags(delivery_mode, property_flags)
    timer_record = hold(
        session.node.timer, session.vhost.name, publish, headers, record_flags, now_ms
    )
    # The plugin routes a held message to no queue now: mandatory gets 312 at once.
    return RouteOutcome(timer_record, [], False)


def _held_copies(
    session: Publisher,
    publish: Publish,
    headers: Mapping[str, Any] | None,
    delivery_mode: int,
    property_flags: int,
    now_ms: int,
    held_by: tuple[str, ...],
) -> tuple[Record, ...]:
    """Timer records for the delayed-message exchanges that routing reached through
    exchange-to-exchange bindings, one copy each."""
    assert headers is not None  # only a message with an x-delay is held
    assert session.vhost is not None
    record_flags = _record_flags(delivery_mode, property_flags)
    timer = session.node.timer
    return tuple(
        hold(timer, session.vhost.name, publish, headers, record_flags, now_ms, target=name)
        for name in held_by
    )


def _record(
    channel: ChannelState,
    publish: Publish,
    properties_bytes: bytes,
    queues: list[QueueRuntime],
    delivery_mode: int,
    property_flags: int,
    now_ms: int,
    headers: Mapping[str, Any] | None,  # a queue with gray partitions looks for the marker
) -> RouteOutcome:
    if not queues:
        return UNROUTED
    record_flags = _record_flags(delivery_mode, property_flags)
    rejected = False
    size = len(publish.body)
    for queue in queues:
        if queue.rejects_publish:  # rare: only queues with x-overflow reject-publish(-dlx)
            accepted = _refuse_overflow(queues, publish, properties_bytes, record_flags)
            rejected, queues = accepted is not queues, accepted
            if not queues:
                return RouteOutcome(None, [], True, True)
            break
    if len(queues) == 1:
        queue = queues[0]
        partition = 0 if queue.partitions == 1 else _partition(channel, queue, headers, publish)
        destinations: tuple[tuple[int, int], ...] = ((queue.queue_id, partition),)
    else:
        destinations = tuple(
            (q.queue_id, 0)
            if q.partitions == 1
            else (q.queue_id, _partition(channel, q, headers, publish))
            for q in queues
        )  # (the check before the call: most queues have one partition)
    if not channel.tx_mode:  # tx publishes count once tx.commit has stored them
        for queue in queues:
            queue.count_in(size, record_flags)
    fields = (
        publish.exchange.encode(),
        publish.routing_key.encode(),
        properties_bytes,
        publish.body,
        destinations,
        now_ms,
        record_flags,
    )
    record: Record = _make_tuple(Record, fields)  # no Python-level __new__ per message
    outcome: RouteOutcome = _make_tuple(RouteOutcome, (record, queues, True, rejected, ()))
    return outcome


def _refuse_overflow(
    queues: list[QueueRuntime], publish: Publish, properties: bytes, record_flags: int
) -> list[QueueRuntime]:
    """x-overflow reject-publish(-dlx) and reject breakers: full queues drop out of the
    destinations (the publisher is nacked); reject-publish-dlx dead-letters the message from
    them (a breaker's refusal dead-letters nothing)."""
    size = len(publish.body)
    accepted = []
    for queue in queues:
        if queue.breaker_refuses():  # a tripped depth breaker (gateway/queues/breaker.py)
            continue
        if not (queue.behaviour.rejects_publish and queue.would_overflow(size)):
            accepted.append(queue)
            continue
        queue.rejected_publishes += 1
        if queue.behaviour.overflow == "reject-publish-dlx":
            queue.dead_letter_publish(publish, properties, record_flags)
    return accepted if len(accepted) < len(queues) else queues


def _record_flags(delivery_mode: int, property_flags: int) -> int:
    """The store record's flags: persistent, and whether an expiration is to be read."""
    flags = PERSISTENT if delivery_mode == 2 else 0
    return flags | EXPIRES if property_flags & EXPIRATION else flags


def _check_expiration(expiration: str | None) -> None:
    """rabbit_basic:parse_expiration: string:to_integer/1 must read the whole string."""
    if expiration is None:
        return
    match = _LEADING_INTEGER.match(expiration)
    if match is None:
        term = "no_integer"
    elif match.end() < len(expiration):
        rest = expiration[match.end() :].replace("\\", "\\\\").replace('"', '\\"')
        term = f'{{leftover_string,"{rest}"}}'
    elif int(match.group()) < 0:
        term = f"{{value_negative,{int(match.group())}}}"
    else:
        return
    raise PreconditionFailed(f"invalid expiration '{expiration}': {term}", 60, 40)


def _delivery_mode(properties: bytes, flags: int) -> int:
    """delivery-mode without decoding: it follows content-type, content-encoding and headers,
    which are skipped by their length prefixes. -1 if the bytes do not parse (the full
    decoder then raises the proper error)."""
    try:
        pos = 2
        if flags & 0x8000:  # content-type shortstr
            pos += 1 + properties[pos]
        if flags & 0x4000:  # content-encoding shortstr
            pos += 1 + properties[pos]
        if flags & HEADERS:  # field table: u32 length
            pos += 4 + int.from_bytes(properties[pos : pos + 4], "big")
        return properties[pos]
    except IndexError:
        return -1


def _direct_reply(
    session: Publisher, publisher: ChannelState, publish: Publish, properties_bytes: bytes
) -> RouteOutcome:
    """A reply to a direct reply-to consumer: delivered at once, never stored; one of
    another gateway's consumers (cluster): handed to the relay (gateway/cluster/replies.py)."""
    replies = session.node.direct_replies
    target = replies.lookup(publish.routing_key)
    if target is None:
        relay = replies.relay  # in a cluster: the key may be another gateway's
        tag = replies.remote_tag(publish.routing_key) if relay is not None else None
        if relay is None or tag is None:
            return UNROUTED
        returns_to = publisher if publish.mandatory else None
        body = publish.body
        relayed = relay.forward(tag, publish.routing_key, properties_bytes, body, returns_to)
        return RouteOutcome(None, [], True) if relayed else UNROUTED
    channel, consumer_tag = target
    channel.session.conn.send_deliver(
        channel.number,
        consumer_tag,
        channel.take_tag(),
        False,
        "",
        publish.routing_key,
        properties_bytes,
        publish.body,
    )
    channel.session.mark_dirty()
    return RouteOutcome(None, [], True)


def deliver_reply(
    channel: ChannelState, consumer_tag: str, routing_key: str, properties: bytes, body: bytes
) -> None:
    """A reply relayed from another gateway, delivered as ``_direct_reply`` does."""
    if channel.closing:
        return
    session = channel.session
    session.conn.send_deliver(
        channel.number, consumer_tag, channel.take_tag(), False, "", routing_key, properties, body
    )
    session.mark_dirty()


def return_reply(
    channel: ChannelState, routing_key: str, properties: bytes, body: bytes | bytearray
) -> None:
    """A mandatory reply relayed to a requester that was gone: 312 NO_ROUTE, as here."""
    session = channel.session
    session.node.stats.return_unroutable += 1
    frames = frame_writer.return_(
        channel.number, 312, "NO_ROUTE", "", routing_key, properties, body, session.conn.frame_max
    )
    session.conn.send_frames(channel.number, frames)
    session.mark_dirty()


def _partition(
    channel: ChannelState,
    queue: QueueRuntime,
    headers: Mapping[str, Any] | None,
    publish: Publish,
) -> int:
    """Sticky per channel: keeps RabbitMQ's per-channel FIFO into a partitioned queue (into
    each lane of a queue with gray partitions: gray publishers and marked messages go to
    the gray ones, the rest to the others). A keyed-order queue: the key's partition."""
    if queue.partitions == 1:
        return 0
    if queue.keyed:
        return queue.key_partition(publish.routing_key, headers)
    if queue.gray_parts:
        session = channel.session
        gray = session.gray_publish or marked_gray(headers, session.node.settings.gray_header)
        return _lane_partition(channel, queue, gray)
    partition = channel.queue_partition.get(queue.queue_id)
    if partition is None:
        partition = queue.pick_partition()
        channel.queue_partition[queue.queue_id] = partition
    elif queue.write_parts and partition not in queue.write_parts:
        # Scaled down or moved (meta/channel_route.py): the same successor on every gateway
        # and for every later publish, so the channel's order holds from here on.
        partition = queue.successor(partition)
        channel.queue_partition[queue.queue_id] = partition
    return partition


def _lane_partition(channel: ChannelState, queue: QueueRuntime, gray: bool) -> int:
    key = ~queue.queue_id if gray else queue.queue_id  # one sticky partition per lane
    parts = queue.gray_parts if gray else queue.normal_parts
    partition = channel.queue_partition.get(key)
    if partition is None or partition not in parts:  # new, or K changed since
        partition = queue.pick_partition(gray)
        channel.queue_partition[key] = partition
    return partition
