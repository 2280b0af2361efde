"""basic.* methods: qos, consume, cancel, get, ack, nack, reject and recover.

A consume registers a Consumer on the queue and wakes the push scheduler; a get takes one
message under the same consumption controls as a push; acks, nacks and rejects (held back
in tx mode) settle deliveries through the session.
"""

from __future__ import annotations

import base64
import os
from typing import TYPE_CHECKING

from pamqp import commands

from gateway.amqp import frame_writer
from gateway.amqp.errors import AccessRefused, AMQPNotImplemented, NotAllowed, PreconditionFailed
from gateway.features import stream as stream_queue
from gateway.features.direct_reply import REPLY_QUEUE
from gateway.queues.runtime import QueueRuntime
from gateway.queues.single_active import SingleActiveChoice
from gateway.sessions import consume_checks
from gateway.sessions.channel_state import ChannelState, Consumer, Delivery, TxAction
from gateway.sessions.method_support import (
    exclusive_check,
    queue_name_or_last,
    send_method,
    vhost_of,
)

if TYPE_CHECKING:
    from gateway.sessions.session import Session


# -- basic ------------------------------------------------------------------------------


async def basic_qos(session: Session, channel: ChannelState, m: commands.Basic.Qos) -> None:
    if m.prefetch_size:
        raise AMQPNotImplemented(f"prefetch_size!=0 ({m.prefetch_size})", 60, 10)
    if m.global_:
        channel.prefetch_global = m.prefetch_count
    else:
        channel.prefetch_count = m.prefetch_count
    send_method(session, channel, commands.Basic.QosOk())
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
    send_method(session, channel, commands.Basic.ConsumeOk(tag), m.nowait)


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
    vhost = vhost_of(session)
    name = queue_name_or_last(channel, m.queue, 60, 20)
    # rabbit_channel: the tag's reuse, then read on the queue, then the queue itself.
    if m.consumer_tag in channel.consumers:
        raise NotAllowed(f"attempt to reuse consumer tag '{m.consumer_tag}'", 60, 20)
    session.grants.require("read", "queue", name, 60, 20)
    queue = vhost.queue(name, 60, 20)
    exclusive_check(session, queue, 60, 20)
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
    send_method(session, channel, commands.Basic.ConsumeOk(tag), m.nowait)
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
    send_method(session, channel, commands.Basic.CancelOk(m.consumer_tag), m.nowait)
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
    name = queue_name_or_last(channel, m.queue, 60, 70)
    session.grants.require("read", "queue", name, 60, 70)
    queue = vhost_of(session).queue(name, 60, 70)
    exclusive_check(session, queue, 60, 70)
    if stream_queue.is_stream(queue):
        raise stream_queue.not_supported("basic.get", queue, 60, 70)
    queue.touch()
    if not may_get(session, queue):  # stopped or throttled by an operator: nothing to get
        send_method(session, channel, commands.Basic.GetEmpty())
        return
    cluster = session.node.cluster
    if cluster is not None and not await cluster.hold_for_get(queue):
        send_method(session, channel, commands.Basic.GetEmpty())  # another gateway delivers it
        return
    taken = await queue.get(session.gray_lane)  # a queue with gray partitions: its lane
    if taken is None:
        session.node.stats.get_empty += 1
        send_method(session, channel, commands.Basic.GetEmpty())
        return
    partition, message, redelivered = taken
    queue.delivered += 1
    session.node.stats.count_get(m.no_ack, redelivered)
    took_tokens(session, queue, len(message.body))
    tag = channel.take_tag()
    if m.no_ack:
        queue.settle(partition, message)
    else:
        channel.unacked[tag] = Delivery(queue, partition, message, None, session.now())
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


_SETTLE_METHOD_IDS = {"ack": 80, "nack": 120, "reject": 90}


def settle_tags(
    session: Session, channel: ChannelState, kind: str, tag: int, multiple: bool, requeue: bool
) -> None:
    if channel.tx_mode:
        channel.tx_actions.append(TxAction(kind, tag, multiple, requeue))
        return
    method_id = _SETTLE_METHOD_IDS[kind]
    deliveries = _named(channel, tag, multiple, method_id)
    if kind != "ack":  # an ack settles stream deliveries too: no look per delivery for it
        stream = next((d.queue for d in deliveries if stream_queue.is_stream(d.queue)), None)
        if stream is not None:
            raise stream_queue.not_supported("basic.nack and basic.reject", stream, 60, method_id)
    session.settle(channel, deliveries, None if kind == "ack" else requeue)


def _named(channel: ChannelState, tag: int, multiple: bool, method_id: int) -> list[Delivery]:
    """The deliveries an ack, nack or reject names, taken off the channel; PRECONDITION_FAILED
    for a tag that is not outstanding (``multiple`` with tag 0: every one)."""
    if (tag == 0 and multiple) or tag in channel.unacked:
        return channel.pop_deliveries(tag, multiple)
    raise PreconditionFailed(f"unknown delivery tag {tag}", 60, method_id)


async def basic_ack(session: Session, channel: ChannelState, m: commands.Basic.Ack) -> None:
    settle_tags(session, channel, "ack", m.delivery_tag, m.multiple, False)


async def basic_acks(
    session: Session, channel: ChannelState, acks: list[commands.Basic.Ack]
) -> None:
    """Several basic.acks in a row on one channel (a client that acks every message on its
    own) settled at once: what basic_ack one after the other does, with one settle. An
    unknown tag settles those before it and then raises (the channel closes, and the acks
    after it are dropped, as on a closing channel)."""
    if channel.tx_mode:
        for m in acks:
            settle_tags(session, channel, "ack", m.delivery_tag, m.multiple, False)
        return
    deliveries: list[Delivery] = []
    try:
        for m in acks:
            deliveries += _named(channel, m.delivery_tag, m.multiple, _SETTLE_METHOD_IDS["ack"])
    finally:
        session.settle(channel, deliveries, None)


async def basic_nack(session: Session, channel: ChannelState, m: commands.Basic.Nack) -> None:
    settle_tags(session, channel, "nack", m.delivery_tag, m.multiple, m.requeue)


async def basic_reject(session: Session, channel: ChannelState, m: commands.Basic.Reject) -> None:
    settle_tags(session, channel, "reject", m.delivery_tag or 0, False, bool(m.requeue))


async def basic_recover(session: Session, channel: ChannelState, m: commands.Basic.Recover) -> None:
    if not m.requeue:
        raise AMQPNotImplemented("requeue=false", 60, 110)
    consume_checks.check_recover(channel, 60, 110)
    session.requeue_unacked(channel)
    send_method(session, channel, commands.Basic.RecoverOk())


async def basic_recover_async(
    session: Session, channel: ChannelState, m: commands.Basic.RecoverAsync
) -> None:
    if not m.requeue:
        raise AMQPNotImplemented("requeue=false", 60, 100)
    consume_checks.check_recover(channel, 60, 100)
    session.requeue_unacked(channel)
