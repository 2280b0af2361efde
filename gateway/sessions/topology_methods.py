"""exchange.* and queue.* methods: declare, bind, unbind, purge and delete.

Each checks the user's permissions where rabbit_channel 3.10 does, in its order, then asks
the vhost (which keeps the router, the queues and the metadata in step) and answers with
RabbitMQ's reply, or raises the AMQPError RabbitMQ would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pamqp import commands

from gateway.amqp import unchecked
from gateway.amqp.errors import AccessRefused, PreconditionFailed
from gateway.features import stream as stream_queue
from gateway.features.delayed_exchange import EXCHANGE_TYPES
from gateway.features.direct_reply import REPLY_QUEUE
from gateway.sessions.channel_state import ChannelState
from gateway.sessions.method_support import (
    argument_types,
    exclusive_check,
    queue_name_or_last,
    send_method,
    strip_cr_lf,
    vhost_of,
)
from gateway.vhost import VirtualHost
from meta import checks
from meta.amqp_values import infer_type
from meta.models import BindingDef, DestinationType, ExchangeDef, QueueDef
from meta.state import augment_queue_arguments, server_generated_queue_name

if TYPE_CHECKING:
    from gateway.sessions.session import Session


# -- permissions (rabbit_channel 3.10: check_<kind>_permitted, in its order) ---------------
# Each check comes where rabbit_channel makes it: errors RabbitMQ raises earlier (unknown
# exchange type, default exchange, reserved 'amq.' names) are left to the metadata call,
# which raises them before anything is changed.


def _exchange_name_arg(m: Any, key: str) -> str | None:
    """rabbit_misc:r_arg/4: the exchange a longstr argument names; None when absent or of
    another type (the declare refuses that itself, before any permission check)."""
    arguments = m.arguments or {}
    if key not in arguments:
        return None
    value = arguments[key]
    if (argument_types(m).get(key) or infer_type(value)) != "longstr":
        return None
    return value if isinstance(value, str) else bytes(value).decode("utf-8", "replace")


async def _authorize_exchange_declare(
    session: Session, vhost: VirtualHost, m: commands.Exchange.Declare
) -> None:
    name = m.exchange
    if m.passive or not name or m.exchange_type not in EXCHANGE_TYPES:
        return  # passive: no check; '' and unknown types are refused before the check
    grants = session.grants
    grants.require("configure", "exchange", name, 40, 10)
    if name.startswith("amq.") or await vhost.meta.get_exchange(vhost.name, name) is not None:
        return  # existing: no alternate-exchange check; 'amq.*' is refused before it
    alternate = _exchange_name_arg(m, "alternate-exchange")
    if alternate is not None:
        grants.require("read", "exchange", name, 40, 10)
        grants.require("write", "exchange", alternate, 40, 10)


def _authorize_binding(
    session: Session, source: str, destination: str, kind: DestinationType, method_id: int
) -> None:
    """rabbit_channel:binding_action/10: write on the destination, read on the source."""
    class_id = 40 if kind == "exchange" else 50
    grants = session.grants
    grants.require("write", kind, destination, class_id, method_id)
    if source == "" or (kind == "exchange" and destination == ""):
        return  # check_not_default_exchange refuses it next (in the metadata call)
    grants.require("read", "exchange", source, class_id, method_id)


async def _authorize_queue_declare(
    session: Session, vhost: VirtualHost, definition: QueueDef, m: commands.Queue.Declare
) -> None:
    """configure on the queue; for a new queue with x-dead-letter-exchange also read on it
    and write on that exchange. A server-named queue is checked under a freshly drawn name
    (the store draws its own, checked again after the declare)."""
    name = definition.name
    if name.startswith("amq."):
        return  # check_name refuses it before the check
    if name == "":
        queue_type = checks.queue_type_of(augment_queue_arguments(definition))
        if queue_type != checks.DEFAULT_QUEUE_TYPE:
            return  # "Cannot declare a server-named queue" comes first
        name, existing = server_generated_queue_name(), False
    else:
        existing = await vhost.meta.get_queue(vhost.name, name) is not None
    _check_queue_declare(session, name, existing, m)


def _check_queue_declare(
    session: Session, name: str, existing: bool, m: commands.Queue.Declare
) -> None:
    grants = session.grants
    grants.require("configure", "queue", name, 50, 10)
    if existing:
        return
    dead_letter_exchange = _exchange_name_arg(m, "x-dead-letter-exchange")
    if dead_letter_exchange is not None:
        grants.require("read", "queue", name, 50, 10)
        grants.require("write", "exchange", dead_letter_exchange, 50, 10)


# -- exchange ---------------------------------------------------------------------------


async def exchange_declare(
    session: Session, channel: ChannelState, m: commands.Exchange.Declare
) -> None:
    strip_cr_lf(m, "exchange")
    definition = ExchangeDef(
        vhost=vhost_of(session).name,
        name=m.exchange,
        type=m.exchange_type,
        durable=m.durable,
        auto_delete=m.auto_delete,
        internal=m.internal,
        arguments=dict(m.arguments or {}),
        argument_types=argument_types(m),
    )
    await _authorize_exchange_declare(session, vhost_of(session), m)
    await vhost_of(session).declare_exchange(definition, m.passive)
    send_method(session, channel, commands.Exchange.DeclareOk(), m.nowait)


async def exchange_delete(
    session: Session, channel: ChannelState, m: commands.Exchange.Delete
) -> None:
    strip_cr_lf(m, "exchange")
    if m.exchange and not m.exchange.startswith("amq."):  # those are refused before the check
        session.grants.require("configure", "exchange", m.exchange, 40, 20)
    await vhost_of(session).delete_exchange(m.exchange, m.if_unused)
    send_method(session, channel, commands.Exchange.DeleteOk(), m.nowait)


def _binding(
    session: Session, m: Any, source: str, destination: str, kind: DestinationType
) -> BindingDef:
    """The binding a bind/unbind method names (queue or exchange destination)."""
    return BindingDef(
        vhost=vhost_of(session).name,
        source=source,
        destination=destination,
        destination_type=kind,
        routing_key=m.routing_key,
        arguments=dict(m.arguments or {}),
        argument_types=argument_types(m),
        argument_wire=dict(getattr(m, "argument_wire", None) or {}),
    )


async def exchange_bind(session: Session, channel: ChannelState, m: commands.Exchange.Bind) -> None:
    strip_cr_lf(m, "source", "destination")
    _authorize_binding(session, m.source, m.destination, "exchange", 30)
    binding = _binding(session, m, m.source, m.destination, "exchange")
    await vhost_of(session).bind(binding, session.owner_id, 40, 30)
    send_method(session, channel, commands.Exchange.BindOk(), m.nowait)


async def exchange_unbind(
    session: Session, channel: ChannelState, m: commands.Exchange.Unbind
) -> None:
    strip_cr_lf(m, "source", "destination")
    _authorize_binding(session, m.source, m.destination, "exchange", 40)
    binding = _binding(session, m, m.source, m.destination, "exchange")
    await vhost_of(session).unbind(binding, session.owner_id, 40, 40)
    send_method(session, channel, commands.Exchange.UnbindOk(), m.nowait)


# -- queue ------------------------------------------------------------------------------


async def queue_declare(session: Session, channel: ChannelState, m: commands.Queue.Declare) -> None:
    strip_cr_lf(m, "queue")
    vhost = vhost_of(session)
    if m.queue == REPLY_QUEUE and m.passive:  # the pseudo-queue exists for every client
        consumers = 1 if channel.reply_key else 0  # RabbitMQ counts this channel's consumer
        send_method(session, channel, commands.Queue.DeclareOk(REPLY_QUEUE, 0, consumers), m.nowait)
        return
    definition = vhost.with_partitions(
        QueueDef(
            vhost=vhost.name,
            name=m.queue,
            durable=m.durable,
            exclusive_owner=session.owner_id if m.exclusive else None,
            auto_delete=m.auto_delete,
            arguments=dict(m.arguments or {}),
            argument_types=argument_types(m),
        )
    )
    if not m.passive:  # a passive declare checks no permission
        await _authorize_queue_declare(session, vhost, definition, m)
    queue = await vhost.declare_queue(definition, m.passive, session.owner_id)
    if not m.passive and not m.queue:
        # The store drew its own server-generated name: the checks must hold for it too.
        try:
            _check_queue_declare(session, queue.name, False, m)
        except AccessRefused:
            await vhost.delete_queue(queue.name, session.owner_id)
            raise
    queue.touch()  # a declare, passive too, renews x-expires
    channel.last_queue = queue.name
    count = await session.node.broadcasts.message_count(queue)
    # The name may be any UTF-8 (pamqp's constructor allows ASCII names only).
    ok = unchecked.build(
        commands.Queue.DeclareOk,
        queue=queue.name,
        message_count=count,
        consumer_count=len(queue.consumers),
    )
    send_method(session, channel, ok, m.nowait)


async def queue_bind(session: Session, channel: ChannelState, m: commands.Queue.Bind) -> None:
    strip_cr_lf(m, "queue", "exchange")
    queue = queue_name_or_last(channel, m.queue, 50, 20)
    _authorize_binding(session, m.exchange, queue, "queue", 20)
    await vhost_of(session).bind(
        _binding(session, m, m.exchange, queue, "queue"), session.owner_id, 50, 20
    )
    send_method(session, channel, commands.Queue.BindOk(), m.nowait)


async def queue_unbind(session: Session, channel: ChannelState, m: commands.Queue.Unbind) -> None:
    strip_cr_lf(m, "queue", "exchange")
    queue = queue_name_or_last(channel, m.queue, 50, 50)
    _authorize_binding(session, m.exchange, queue, "queue", 50)
    binding = _binding(session, m, m.exchange, queue, "queue")
    await vhost_of(session).unbind(binding, session.owner_id, 50, 50)
    send_method(session, channel, commands.Queue.UnbindOk())


async def queue_purge(session: Session, channel: ChannelState, m: commands.Queue.Purge) -> None:
    vhost = vhost_of(session)
    name = queue_name_or_last(channel, m.queue, 50, 30)
    session.grants.require("read", "queue", name, 50, 30)
    queue = vhost.queue(name, 50, 30)
    exclusive_check(session, queue, 50, 30)
    if stream_queue.is_stream(queue):
        raise stream_queue.not_supported("queue.purge", queue, 50, 30)
    count = await session.node.broadcasts.purge(queue)
    send_method(session, channel, commands.Queue.PurgeOk(count), m.nowait)


async def queue_delete(session: Session, channel: ChannelState, m: commands.Queue.Delete) -> None:
    strip_cr_lf(m, "queue")
    vhost = vhost_of(session)
    name = queue_name_or_last(channel, m.queue, 50, 40)
    session.grants.require("configure", "queue", name, 50, 40)
    queue = vhost.queues.get(name)
    count = 0
    if queue is not None:
        exclusive_check(session, queue, 50, 40)
        where = f"queue '{name}' in vhost '{vhost.name}'"
        if m.if_unused and queue.consumers:
            raise PreconditionFailed(f"{where} in use", 50, 40)
        count = await session.node.broadcasts.message_count(queue)
        if stream_queue.is_stream(queue):
            count = 0  # as RabbitMQ: a stream is never "not empty" and deletes with 0
        if m.if_empty and count:
            raise PreconditionFailed(f"{where} not empty", 50, 40)
        # Consumers are cancelled as the queue goes: this channel's cancels wait for delete-ok.
        session.conn.hold(channel.number)
        try:
            await vhost.delete_queue(name, session.owner_id)
        except BaseException:
            session.conn.release(channel.number)  # what was held goes before the error's close
            raise
        reply = None if m.nowait else commands.Queue.DeleteOk(count)
        session.conn.release(channel.number, reply)
        return
    send_method(session, channel, commands.Queue.DeleteOk(count), m.nowait)
