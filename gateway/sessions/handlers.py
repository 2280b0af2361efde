"""Channel methods: what the broker does for each, with RabbitMQ's answers and errors.

Each handler takes the session, the channel and the decoded pamqp method; an AMQPError it
raises closes the channel (soft) or the connection (hard) with exactly that code and text.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pamqp import base, commands

from gateway.amqp import frame_writer, unchecked
from gateway.amqp.errors import (
    AccessRefused,
    AMQPNotImplemented,
    CommandInvalid,
    NotAllowed,
    NotFound,
    PreconditionFailed,
)
from gateway.features import stream as stream_queue
from gateway.features.delayed_exchange import EXCHANGE_TYPES
from gateway.features.direct_reply import REPLY_QUEUE
from gateway.queues.runtime import QueueRuntime
from gateway.queues.single_active import SingleActiveChoice
from gateway.sessions import consume_checks
from gateway.sessions.channel_state import ChannelState, Consumer, Delivery, TxAction
from gateway.vhost import VirtualHost, amqp_error
from meta import checks
from meta.amqp_values import infer_type
from meta.errors import MetaError
from meta.models import BindingDef, DestinationType, ExchangeDef, QueueDef
from meta.state import augment_queue_arguments, server_generated_queue_name

if TYPE_CHECKING:
    from gateway.sessions.session import Session

Handler = Callable[["Session", ChannelState, Any], Awaitable[None]]


def _vhost(session: Session) -> VirtualHost:
    assert session.vhost is not None
    return session.vhost


def _send(
    session: Session, channel: ChannelState, method: base.Frame, nowait: bool = False
) -> None:
    if not nowait:
        session.conn.send_method(channel.number, method)


def _argument_types(method: Any) -> dict[str, str]:
    """Wire types of ``arguments`` as the frame decoder recorded them (see amqp/methods.py)."""
    return dict(getattr(method, "argument_types", None) or {})


def _strip_cr_lf(method: Any, *fields: str) -> None:
    """rabbit_channel:strip_cr_lf/1: CR and LF are dropped from the names queue.declare,
    queue.delete, exchange.declare, exchange.delete and the bind methods carry (but not
    from those of basic.get, consume, publish or queue.purge)."""
    for name in fields:
        value = getattr(method, name)
        if "\n" in value or "\r" in value:
            setattr(method, name, value.replace("\n", "").replace("\r", ""))


def _queue_name(channel: ChannelState, name: str, class_id: int, method_id: int) -> str:
    """'' means the channel's most recently declared queue, as in RabbitMQ."""
    if name:
        return name
    if not channel.last_queue:
        raise NotFound("no previously declared queue", class_id, method_id)
    return channel.last_queue


def _exclusive_check(session: Session, queue: QueueRuntime, class_id: int, method_id: int) -> None:
    try:
        checks.check_exclusive_access(queue.definition, session.owner_id)
    except MetaError as error:
        raise amqp_error(error, class_id, method_id) from None


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
    if (_argument_types(m).get(key) or infer_type(value)) != "longstr":
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
    _strip_cr_lf(m, "exchange")
    definition = ExchangeDef(
        vhost=_vhost(session).name,
        name=m.exchange,
        type=m.exchange_type,
        durable=m.durable,
        auto_delete=m.auto_delete,
        internal=m.internal,
        arguments=dict(m.arguments or {}),
        argument_types=_argument_types(m),
    )
    await _authorize_exchange_declare(session, _vhost(session), m)
    await _vhost(session).declare_exchange(definition, m.passive)
    _send(session, channel, commands.Exchange.DeclareOk(), m.nowait)


async def exchange_delete(
    session: Session, channel: ChannelState, m: commands.Exchange.Delete
) -> None:
    _strip_cr_lf(m, "exchange")
    if m.exchange and not m.exchange.startswith("amq."):  # those are refused before the check
        session.grants.require("configure", "exchange", m.exchange, 40, 20)
    await _vhost(session).delete_exchange(m.exchange, m.if_unused)
    _send(session, channel, commands.Exchange.DeleteOk(), m.nowait)


def _binding(
    session: Session, m: Any, source: str, destination: str, kind: DestinationType
) -> BindingDef:
    """The binding a bind/unbind method names (queue or exchange destination)."""
    return BindingDef(
        vhost=_vhost(session).name,
        source=source,
        destination=destination,
        destination_type=kind,
        routing_key=m.routing_key,
        arguments=dict(m.arguments or {}),
        argument_types=_argument_types(m),
        argument_wire=dict(getattr(m, "argument_wire", None) or {}),
    )


async def exchange_bind(session: Session, channel: ChannelState, m: commands.Exchange.Bind) -> None:
    _strip_cr_lf(m, "source", "destination")
    _authorize_binding(session, m.source, m.destination, "exchange", 30)
    binding = _binding(session, m, m.source, m.destination, "exchange")
    await _vhost(session).bind(binding, session.owner_id, 40, 30)
    _send(session, channel, commands.Exchange.BindOk(), m.nowait)


async def exchange_unbind(
    session: Session, channel: ChannelState, m: commands.Exchange.Unbind
) -> None:
    _strip_cr_lf(m, "source", "destination")
    _authorize_binding(session, m.source, m.destination, "exchange", 40)
    binding = _binding(session, m, m.source, m.destination, "exchange")
    await _vhost(session).unbind(binding, session.owner_id, 40, 40)
    _send(session, channel, commands.Exchange.UnbindOk(), m.nowait)


# -- queue ------------------------------------------------------------------------------


async def queue_declare(session: Session, channel: ChannelState, m: commands.Queue.Declare) -> None:
    _strip_cr_lf(m, "queue")
    vhost = _vhost(session)
    if m.queue == REPLY_QUEUE and m.passive:  # the pseudo-queue exists for every client
        consumers = 1 if channel.reply_key else 0  # RabbitMQ counts this channel's consumer
        _send(session, channel, commands.Queue.DeclareOk(REPLY_QUEUE, 0, consumers), m.nowait)
        return
    definition = vhost.with_partitions(
        QueueDef(
            vhost=vhost.name,
            name=m.queue,
            durable=m.durable,
            exclusive_owner=session.owner_id if m.exclusive else None,
            auto_delete=m.auto_delete,
            arguments=dict(m.arguments or {}),
            argument_types=_argument_types(m),
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
    _send(session, channel, ok, m.nowait)


async def queue_bind(session: Session, channel: ChannelState, m: commands.Queue.Bind) -> None:
    _strip_cr_lf(m, "queue", "exchange")
    queue = _queue_name(channel, m.queue, 50, 20)
    _authorize_binding(session, m.exchange, queue, "queue", 20)
    await _vhost(session).bind(
        _binding(session, m, m.exchange, queue, "queue"), session.owner_id, 50, 20
    )
    _send(session, channel, commands.Queue.BindOk(), m.nowait)


async def queue_unbind(session: Session, channel: ChannelState, m: commands.Queue.Unbind) -> None:
    _strip_cr_lf(m, "queue", "exchange")
    queue = _queue_name(channel, m.queue, 50, 50)
    _authorize_binding(session, m.exchange, queue, "queue", 50)
    binding = _binding(session, m, m.exchange, queue, "queue")
    await _vhost(session).unbind(binding, session.owner_id, 50, 50)
    _send(session, channel, commands.Queue.UnbindOk())


async def queue_purge(session: Session, channel: ChannelState, m: commands.Queue.Purge) -> None:
    vhost = _vhost(session)
    name = _queue_name(channel, m.queue, 50, 30)
    session.grants.require("read", "queue", name, 50, 30)
    queue = vhost.queue(name, 50, 30)
    _exclusive_check(session, queue, 50, 30)
    if stream_queue.is_stream(queue):
        raise stream_queue.not_supported("queue.purge", queue, 50, 30)
    count = await session.node.broadcasts.purge(queue)
    _send(session, channel, commands.Queue.PurgeOk(count), m.nowait)


async def queue_delete(session: Session, channel: ChannelState, m: commands.Queue.Delete) -> None:
    _strip_cr_lf(m, "queue")
    vhost = _vhost(session)
    name = _queue_name(channel, m.queue, 50, 40)
    session.grants.require("configure", "queue", name, 50, 40)
    queue = vhost.queues.get(name)
    count = 0
    if queue is not None:
        _exclusive_check(session, queue, 50, 40)
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
    _send(session, channel, commands.Queue.DeleteOk(count), m.nowait)


# -- basic ------------------------------------------------------------------------------


async def basic_qos(session: Session, channel: ChannelState, m: commands.Basic.Qos) -> None:
    if m.prefetch_size:
        raise AMQPNotImplemented(f"prefetch_size!=0 ({m.prefetch_size})", 60, 10)
    if m.global_:
        channel.prefetch_global = m.prefetch_count
    else:
        channel.prefetch_count = m.prefetch_count
    _send(session, channel, commands.Basic.QosOk())
    for queue in channel.queues_with_consumers():
        session.node.scheduler.wake(queue)


def _consumer_tag() -> str:
    return "amq.ctag-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


async def _consume_direct_reply(
    session: Session, channel: ChannelState, m: commands.Basic.Consume
) -> None:
    if not m.no_ack:
        raise PreconditionFailed("reply consumer cannot acknowledge", 60, 20)
    if channel.reply_key:
        raise PreconditionFailed("reply consumer already set", 60, 20)
    tag = m.consumer_tag or _consumer_tag()
    channel.reply_consumer_tag = tag
    channel.reply_key = session.node.direct_replies.register(channel, tag)
    _send(session, channel, commands.Basic.ConsumeOk(tag), m.nowait)


def _check_exclusive_use(queue: QueueRuntime, exclusive: bool) -> None:
    # A single-active-consumer queue refuses exclusive consumers, consumers or not
    # (rabbit_amqqueue_process: exclusive_consume_unavailable).
    exclusive_refused = bool(queue.consumers) or isinstance(queue.choice, SingleActiveChoice)
    if queue.has_exclusive_consumer or (exclusive and exclusive_refused):
        where = f"queue '{queue.name}' in vhost '{queue.definition.vhost}'"
        raise AccessRefused(f"{where} in exclusive use", 60, 20)


async def basic_consume(session: Session, channel: ChannelState, m: commands.Basic.Consume) -> None:
    if m.queue == REPLY_QUEUE:
        await _consume_direct_reply(session, channel, m)
        return
    vhost = _vhost(session)
    name = _queue_name(channel, m.queue, 60, 20)
    # rabbit_channel: the tag's reuse, then read on the queue, then the queue itself.
    if m.consumer_tag in channel.consumers:
        raise NotAllowed(f"attempt to reuse consumer tag '{m.consumer_tag}'", 60, 20)
    session.grants.require("read", "queue", name, 60, 20)
    queue = vhost.queue(name, 60, 20)
    _exclusive_check(session, queue, 60, 20)
    tag = m.consumer_tag or _consumer_tag()
    _check_exclusive_use(queue, m.exclusive)
    if session.node.cluster is not None:  # consumers on other gateways (cluster/views.py)
        await session.node.cluster.views.claims.claim(queue, m.exclusive)
        _check_exclusive_use(queue, m.exclusive)  # a consume here meanwhile
    priority = (m.arguments or {}).get("x-priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise PreconditionFailed(f"invalid arg 'x-priority' for consumer '{tag}'", 60, 20)
    arguments = m.arguments or {}
    types = dict(getattr(m, "argument_types", None) or {})
    spec = consume_checks.check_consume(queue, channel, arguments, types, m.no_ack)
    broadcasts = session.node.broadcasts
    queue = await stream_queue.consumer_queue(
        broadcasts, session, queue, tag, bool(m.consumer_tag), arguments, spec
    )
    consumer = Consumer(
        tag,
        channel,
        queue,
        m.no_ack,
        m.exclusive,
        priority,
        channel.prefetch_count,
        arguments=dict(m.arguments or {}),
    )
    # consume-ok must reach the client before the first delivery.
    _send(session, channel, commands.Basic.ConsumeOk(tag), m.nowait)
    channel.consumers[tag] = consumer
    queue.add_consumer(consumer)
    session.node.scheduler.wake(queue)


async def basic_cancel(session: Session, channel: ChannelState, m: commands.Basic.Cancel) -> None:
    if channel.reply_key and m.consumer_tag == channel.reply_consumer_tag:
        session.node.direct_replies.unregister(channel.reply_key)
        channel.reply_key = channel.reply_consumer_tag = ""
    consumer = channel.consumers.get(m.consumer_tag or "")
    if consumer is not None:
        session.cancel_consumer(consumer)
    _send(session, channel, commands.Basic.CancelOk(m.consumer_tag), m.nowait)
    if consumer is not None:
        await session.maybe_auto_delete(consumer.queue)


def may_get(session: Session, queue: QueueRuntime) -> bool:
    """basic.get under consumption controls: the same rules as a push
    (gateway/controls.py)."""
    if queue.paused or (session.stopped and not queue.control_running):
        return False
    now = queue.clock.monotonic()
    for bucket in (queue.rate_limit, queue.byte_limit):
        if bucket is not None and bucket.available(now) < 1:
            return False
    return session.limits is None or session.limits.ready()


def took_tokens(session: Session, queue: QueueRuntime, body_bytes: int) -> None:
    now = queue.clock.monotonic()
    if queue.rate_limit is not None:
        queue.rate_limit.take(1, now)
    if queue.byte_limit is not None:
        queue.byte_limit.take(body_bytes, now)
    if session.limits is not None:
        session.limits.take(body_bytes)


async def basic_get(session: Session, channel: ChannelState, m: commands.Basic.Get) -> None:
    name = _queue_name(channel, m.queue, 60, 70)
    session.grants.require("read", "queue", name, 60, 70)
    queue = _vhost(session).queue(name, 60, 70)
    _exclusive_check(session, queue, 60, 70)
    if stream_queue.is_stream(queue):
        raise stream_queue.not_supported("basic.get", queue, 60, 70)
    queue.touch()
    if not may_get(session, queue):  # stopped or throttled by an operator: nothing to get
        _send(session, channel, commands.Basic.GetEmpty())
        return
    cluster = session.node.cluster
    if cluster is not None and not await cluster.hold_for_get(queue):
        _send(session, channel, commands.Basic.GetEmpty())  # another gateway delivers it
        return
    taken = await queue.get(session.gray_lane)  # a queue with gray partitions: its lane
    if taken is None:
        session.node.stats.get_empty += 1
        _send(session, channel, commands.Basic.GetEmpty())
        return
    partition, message, redelivered = taken
    queue.delivered += 1
    session.node.stats.count_get(m.no_ack, redelivered)
    took_tokens(session, queue, len(message.body))
    tag = channel.take_tag()
    if m.no_ack:
        queue.settle(partition, message)
    else:
        channel.unacked[tag] = Delivery(queue, partition, message, None, time.monotonic())
    if session.tap is not None:
        message = session.tap.delivered(channel, queue, message, redelivered, tag)
    count = await queue.message_count()
    frames = frame_writer.get_ok(
        channel.number,
        tag,
        redelivered,
        message.exchange,
        message.routing_key,
        count,
        bytes(message.properties),
        bytes(message.body),
        session.conn.frame_max,
    )
    session.conn.send_frames(channel.number, frames)


def _settle(
    session: Session, channel: ChannelState, kind: str, tag: int, multiple: bool, requeue: bool
) -> None:
    if channel.tx_mode:
        channel.tx_actions.append(TxAction(kind, tag, multiple, requeue))
        return
    method_id = {"ack": 80, "nack": 120, "reject": 90}[kind]
    if (tag == 0 and multiple) or tag in channel.unacked:
        deliveries = channel.pop_deliveries(tag, multiple)
    else:
        raise PreconditionFailed(f"unknown delivery tag {tag}", 60, method_id)
    stream = next((d.queue for d in deliveries if stream_queue.is_stream(d.queue)), None)
    if kind != "ack" and stream is not None:
        raise stream_queue.not_supported("basic.nack and basic.reject", stream, 60, method_id)
    session.settle(channel, deliveries, None if kind == "ack" else requeue)


async def basic_ack(session: Session, channel: ChannelState, m: commands.Basic.Ack) -> None:
    _settle(session, channel, "ack", m.delivery_tag, m.multiple, False)


async def basic_nack(session: Session, channel: ChannelState, m: commands.Basic.Nack) -> None:
    _settle(session, channel, "nack", m.delivery_tag, m.multiple, m.requeue)


async def basic_reject(session: Session, channel: ChannelState, m: commands.Basic.Reject) -> None:
    _settle(session, channel, "reject", m.delivery_tag or 0, False, bool(m.requeue))


async def basic_recover(session: Session, channel: ChannelState, m: commands.Basic.Recover) -> None:
    if not m.requeue:
        raise AMQPNotImplemented("requeue=false", 60, 110)
    consume_checks.check_recover(channel, 60, 110)
    session.requeue_unacked(channel)
    _send(session, channel, commands.Basic.RecoverOk())


async def basic_recover_async(
    session: Session, channel: ChannelState, m: commands.Basic.RecoverAsync
) -> None:
    if not m.requeue:
        raise AMQPNotImplemented("requeue=false", 60, 100)
    consume_checks.check_recover(channel, 60, 100)
    session.requeue_unacked(channel)


# -- channel flow, confirm, tx ---------------------------------------------------------------


async def channel_flow(session: Session, channel: ChannelState, m: commands.Channel.Flow) -> None:
    # RabbitMQ 3.10 no longer pauses a channel's deliveries: active=false closes the
    # connection (rabbit_channel), and active=true is a no-op answered with flow-ok.
    if not m.active:
        raise AMQPNotImplemented("active=false", 20, 20)
    _send(session, channel, commands.Channel.FlowOk(True))


async def confirm_select(
    session: Session, channel: ChannelState, m: commands.Confirm.Select
) -> None:
    if channel.tx_mode:
        raise PreconditionFailed("cannot switch from tx to confirm mode", 85, 10)
    channel.confirm_mode = True
    _send(session, channel, commands.Confirm.SelectOk(), m.nowait)


async def tx_select(session: Session, channel: ChannelState, m: commands.Tx.Select) -> None:
    if channel.confirm_mode:
        raise PreconditionFailed("cannot switch from confirm to tx mode", 90, 10)
    channel.tx_mode = True
    _send(session, channel, commands.Tx.SelectOk())


async def tx_commit(session: Session, channel: ChannelState, m: commands.Tx.Commit) -> None:
    if not channel.tx_mode:
        raise PreconditionFailed("channel is not transactional", 90, 20)
    records, channel.tx_publishes = channel.tx_publishes, []
    actions, channel.tx_actions = channel.tx_actions, []
    if records:
        # One batch: the store appends all of it or none of it.
        await _vhost(session).append(records, wait_durable=True)
        session.node.timer.notify()  # a held delayed-exchange message may be among them
    channel.tx_mode = False  # let _settle apply the acks now
    try:
        for action in actions:
            _settle(
                session, channel, action.kind, action.delivery_tag, action.multiple, action.requeue
            )
    finally:
        channel.tx_mode = True
    _send(session, channel, commands.Tx.CommitOk())


async def tx_rollback(session: Session, channel: ChannelState, m: commands.Tx.Rollback) -> None:
    if not channel.tx_mode:
        raise PreconditionFailed("channel is not transactional", 90, 30)
    channel.tx_publishes.clear()
    channel.tx_actions.clear()
    _send(session, channel, commands.Tx.RollbackOk())


HANDLERS: dict[type[base.Frame], Handler] = {
    commands.Exchange.Declare: exchange_declare,
    commands.Exchange.Delete: exchange_delete,
    commands.Exchange.Bind: exchange_bind,
    commands.Exchange.Unbind: exchange_unbind,
    commands.Queue.Declare: queue_declare,
    commands.Queue.Bind: queue_bind,
    commands.Queue.Unbind: queue_unbind,
    commands.Queue.Purge: queue_purge,
    commands.Queue.Delete: queue_delete,
    commands.Basic.Qos: basic_qos,
    commands.Basic.Consume: basic_consume,
    commands.Basic.Cancel: basic_cancel,
    commands.Basic.Get: basic_get,
    commands.Basic.Ack: basic_ack,
    commands.Basic.Nack: basic_nack,
    commands.Basic.Reject: basic_reject,
    commands.Basic.Recover: basic_recover,
    commands.Basic.RecoverAsync: basic_recover_async,
    commands.Channel.Flow: channel_flow,
    commands.Confirm.Select: confirm_select,
    commands.Tx.Select: tx_select,
    commands.Tx.Commit: tx_commit,
    commands.Tx.Rollback: tx_rollback,
}


async def handle_method(session: Session, channel: ChannelState, method: base.Frame) -> None:
    handler = HANDLERS.get(type(method))
    if handler is None:
        class_id, method_id = method.index >> 16, method.index & 0xFFFF
        raise CommandInvalid(f"unexpected method {method.name}", class_id, method_id)
    await handler(session, channel, method)
