"""Channel methods: what the broker does for each, with RabbitMQ's answers and errors.

Each handler takes the session, the channel and the decoded pamqp method; an AMQPError it
raises closes the channel (soft) or the connection (hard) with exactly that code and text.
This module holds the dispatch table and the channel's modes (flow, confirm, tx); the
exchange and queue methods are in topology_methods.py, the basic ones in basic_methods.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pamqp import base, commands

from gateway.amqp.errors import AMQPNotImplemented, CommandInvalid, PreconditionFailed
from gateway.sessions.basic_methods import (
    basic_ack,
    basic_cancel,
    basic_consume,
    basic_get,
    basic_nack,
    basic_qos,
    basic_recover,
    basic_recover_async,
    basic_reject,
    settle_tags,
)
from gateway.sessions.channel_state import ChannelState
from gateway.sessions.method_support import send_method, vhost_of
from gateway.sessions.topology_methods import (
    exchange_bind,
    exchange_declare,
    exchange_delete,
    exchange_unbind,
    queue_bind,
    queue_declare,
    queue_delete,
    queue_purge,
    queue_unbind,
)

if TYPE_CHECKING:
    from gateway.sessions.session import Session

Handler = Callable[["Session", ChannelState, Any], Awaitable[None]]


# -- channel flow, confirm, tx ---------------------------------------------------------------


async def channel_flow(session: Session, channel: ChannelState, m: commands.Channel.Flow) -> None:
    # RabbitMQ 3.10 no longer pauses a channel's deliveries: active=false closes the
    # connection (rabbit_channel), and active=true is a no-op answered with flow-ok.
    if not m.active:
        raise AMQPNotImplemented("active=false", 20, 20)
    send_method(session, channel, commands.Channel.FlowOk(True))


async def confirm_select(
    session: Session, channel: ChannelState, m: commands.Confirm.Select
) -> None:
    if channel.tx_mode:
        raise PreconditionFailed("cannot switch from tx to confirm mode", 85, 10)
    channel.confirm_mode = True
    send_method(session, channel, commands.Confirm.SelectOk(), m.nowait)


async def tx_select(session: Session, channel: ChannelState, m: commands.Tx.Select) -> None:
    if channel.confirm_mode:
        raise PreconditionFailed("cannot switch from confirm to tx mode", 90, 10)
    channel.tx_mode = True
    send_method(session, channel, commands.Tx.SelectOk())


async def tx_commit(session: Session, channel: ChannelState, m: commands.Tx.Commit) -> None:
    if not channel.tx_mode:
        raise PreconditionFailed("channel is not transactional", 90, 20)
    records, channel.tx_publishes = channel.tx_publishes, []
    actions, channel.tx_actions = channel.tx_actions, []
    if records:
        # One batch: the store appends all of it or none of it.
        await vhost_of(session).append(records, wait_durable=True)
        session.node.timer.notify()  # a held delayed-exchange message may be among them
    channel.tx_mode = False  # let _settle apply the acks now
    try:
        for action in actions:
            settle_tags(
                session, channel, action.kind, action.delivery_tag, action.multiple, action.requeue
            )
    finally:
        channel.tx_mode = True
    send_method(session, channel, commands.Tx.CommitOk())


async def tx_rollback(session: Session, channel: ChannelState, m: commands.Tx.Rollback) -> None:
    if not channel.tx_mode:
        raise PreconditionFailed("channel is not transactional", 90, 30)
    channel.tx_publishes.clear()
    channel.tx_actions.clear()
    send_method(session, channel, commands.Tx.RollbackOk())


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
