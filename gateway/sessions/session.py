"""One client connection's broker logic, between the sans-IO connection and the node.

The I/O shell (connection_io.py) feeds events in and writes what the connection queues.
``Session`` holds the connection's state, dispatches its events (login and vhost open in
handshake.py, channel methods in handlers.py, publishes in batch_publish.py), delivers to
its consumers with back-pressure on its output, settles acks, and gives everything back
when the connection ends. Publishes that arrive together are routed one by one but stored
as one batch, and their confirms go through a FIFO pipeline (``confirm_loop``): a confirm
is sent only once its batch is durable, and always after the confirms before it, so acks
can be coalesced with multiple=true.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from gateway.amqp import (
    AMQPError,
    AuthRequested,
    ChannelClosed,
    ChannelCloseRequested,
    ChannelMethod,
    ChannelOpened,
    ConnectionClosed,
    ConnectionCloseSent,
    Event,
    HeartbeatTimeout,
    SecretUpdateRequested,
    ServerConnection,
    VHostOpenRequested,
    frame_writer,
)
from gateway.amqp.errors import InternalError, NotFound
from gateway.queues.consumer import DELIVERY_OVERHEAD_BYTES, LANE_NORMAL
from gateway.queues.rate_limit import Limits
from gateway.queues.runtime import QueueRuntime
from gateway.sessions import deliver_run as deliver_runs
from gateway.sessions import settle_acks
from gateway.sessions.access import NO_GRANTS, Grants
from gateway.sessions.basic_methods import basic_acks
from gateway.sessions.batch_publish import publish_batch
from gateway.sessions.channel_state import ChannelState, Consumer, Delivery
from gateway.sessions.confirms import ConfirmItem, send_confirms
from gateway.sessions.connection_limits import count_out
from gateway.sessions.deliver_run import HIGH_WATER_BYTES, LOW_WATER_BYTES
from gateway.sessions.event_runs import PUBLISHES, event_runs
from gateway.sessions.handlers import handle_method
from gateway.sessions.handshake import authenticate, open_vhost, update_secret
from gateway.sessions.taps import SessionTap
from gateway.vhost import amqp_error
from meta.errors import MetadataUnavailable, MetaError
from storage import BrokerUnavailable, StoredMessage, StoreError

if TYPE_CHECKING:
    from gateway.sessions.host import SessionHost
    from gateway.vhost import VirtualHost

log = logging.getLogger("mqgw.connection")

THROTTLED_READ_SIZE = 4 << 10  # a read's size while publish limits apply


class Session:
    def __init__(self, node: SessionHost, conn: ServerConnection, peer: str, local: str) -> None:
        self.node = node
        # The node's clock (read per delivery, for the consumer timeout): a fake in tests.
        self.now = node.scheduler.clock.monotonic
        self.conn = conn
        self.peer = peer
        self.local = local
        self.name = f"{peer} -> {local}"  # the management API's connection name
        number = node.next_connection_number()
        self.id = f"{self.name}#{number}"  # in log lines
        # "<gateway>/<n>": exclusive queues name their owner so, and a cluster reaps the
        # queues of a gateway that died by that prefix (meta/redis_cluster.py).
        self.owner_id = f"{node.name}/{number}"
        self.vhost: VirtualHost | None = None
        self.counted_in: str | None = None  # the vhost whose max-connections counts it
        self.user = ""
        self.opened = False
        self.channels: dict[int, ChannelState] = {}
        self.writable = True
        self.pending_bytes = 0  # queued in the connection, not yet taken by the writer
        self.sending_bytes = 0  # taken by the writer, in a socket send right now
        self.dirty = anyio.Event()
        self.dirty_marked = False  # dirty is set: the writer has output to take
        self.closing = False
        self.close_reason = ""
        self.published = False  # a publishing connection is paused by the disk alarm
        # Consumption controls (gateway/controls.py): read by Consumer.has_credit.
        self.stopped = False
        self.limits: Limits | None = None
        self.publish_limits: Limits | None = None  # publish throttles (gateway/controls.py)
        self.flow_holds = 0  # publishing paused now by back-pressure (state "flow")
        # Permissions (gateway/sessions/access.py), set when the vhost opens.
        self.grants: Grants = NO_GRANTS
        self.vhost_opened = anyio.Event()  # the handshake is over (handshake_timeout)
        self.impersonator = False
        # Firehose or OpenTelemetry on (gateway/sessions/taps.py); None: nothing traced, no cost.
        self.tap: SessionTap | None = None
        # Gray release (gateway/features/gray.py): set by the node's gray registry.
        self.gray_publish = False
        self.gray_lane = LANE_NORMAL
        send, receive = anyio.create_memory_object_stream[ConfirmItem](256)
        self.confirm_send: MemoryObjectSendStream[ConfirmItem] = send  # batch_publish.py
        self.confirm_receive: MemoryObjectReceiveStream[ConfirmItem] = receive

    # -- output ---------------------------------------------------------------------------

    @property
    def client_properties(self) -> Mapping[str, Any]:
        """What the client said of itself in connection.start-ok (empty before)."""
        return self.conn.client_properties

    @property
    def vhost_name(self) -> str:
        return self.vhost.name if self.vhost is not None else ""

    def mark_dirty(self) -> None:
        if not self.dirty_marked:  # once per writer's turn, not once per delivery
            self.dirty_marked = True
            self.dirty.set()

    def take_dirty(self) -> None:
        """The writer takes its turn: output queued from now on marks it dirty again."""
        self.dirty = anyio.Event()
        self.dirty_marked = False

    def notify_blocked(self, blocked: bool, reason: str) -> None:
        """Resource alarm on or off: tell the client if it asked to be told."""
        if not self.opened:
            return
        if blocked:
            self.conn.send_blocked(reason)
        else:
            self.conn.send_unblocked()
        self.mark_dirty()

    async def wait_until_may_read(self) -> None:
        """Publishers are not read while an alarm is on (their TCP window closes)."""
        alarms = self.node.alarms
        if alarms.blocked and self.published:
            await alarms.wait_released()

    def take_output(self) -> list[frame_writer.Buffer]:
        """The writer takes everything queued; it counts as sending until sent() is called."""
        parts = self.conn.take_output()
        self.pending_bytes = 0
        self.sending_bytes = sum(map(len, parts))
        return parts

    def consumed_queues(self) -> Iterator[QueueRuntime]:
        """The queues this connection's consumers read (gray release)."""
        for channel in self.channels.values():
            yield from channel.queues_with_consumers()

    def sent(self) -> None:
        """The writer's send finished; resume deliveries once the backlog is low again."""
        self.sending_bytes = 0
        if not self.writable and self.pending_bytes < LOW_WATER_BYTES:
            self.writable = True
            for channel in self.channels.values():
                for queue in channel.queues_with_consumers():
                    self.node.scheduler.wake(queue)

    def deliver(
        self,
        consumer: Consumer,
        queue: QueueRuntime,
        partition: int,
        message: StoredMessage,
        redelivered: bool,
    ) -> None:
        channel = consumer.channel
        tag = channel.record_delivery(consumer, queue, partition, message, self.now)
        if self.tap is not None:
            message = self.tap.delivered(channel, queue, message, redelivered, tag)
        body = message.body
        counts = self.node.stats  # gateway/observe/stats.py: plain int adds
        if consumer.no_ack:
            counts.deliver_no_ack += 1
        else:
            counts.deliver += 1
        counts.redeliver += redelivered
        self.conn.send_deliver(
            channel.number,
            consumer.tag,
            tag,
            redelivered,
            message.exchange,
            message.routing_key,
            message.properties,
            body,
        )
        if self.limits is not None:
            self.limits.take(len(body))
        # An estimate of the frames' size; take_output() resets it to what was really queued.
        self.pending_bytes += len(body) + DELIVERY_OVERHEAD_BYTES
        if self.pending_bytes + self.sending_bytes > HIGH_WATER_BYTES:
            self.writable = False
        if not self.dirty_marked:  # mark_dirty's own test, without its call per delivery
            self.mark_dirty()

    # A queue's run to one consumer, each message as deliver() books and frames it
    # (gateway/sessions/deliver_run.py, compiled where built).
    deliver_run = deliver_runs.picked

    # HIGH_WATER_BYTES less what is waiting to be sent (deliver_run.py, compiled where built).
    byte_room = deliver_runs.picked_byte_room

    # -- events ---------------------------------------------------------------------------

    async def handle_events(self, events: Iterable[Event]) -> None:
        """A read's events in order; publishes in a row go as one batch, and so do acks in a
        row on one channel (gateway/sessions/event_runs.py)."""
        for on, run in event_runs(events):
            if on == PUBLISHES:
                await publish_batch(self, run)
            elif on is None or len(run) == 1:
                await self._handle(run[0])
            else:
                acks = [event.method for event in run]
                await self._on_channel(on, acks[0], functools.partial(basic_acks, self, acks=acks))

    async def _handle(self, event: Event) -> None:
        if isinstance(event, ChannelMethod):
            method = event.method
            await self._on_channel(
                event.channel, method, lambda channel: handle_method(self, channel, method)
            )
        elif isinstance(event, AuthRequested):
            await authenticate(self, event)
        elif isinstance(event, VHostOpenRequested):
            await open_vhost(self, event)
        elif isinstance(event, SecretUpdateRequested):
            update_secret(self, event)
        elif isinstance(event, ChannelOpened):
            self.channels[event.channel] = ChannelState(event.channel, self)
        elif isinstance(event, ChannelCloseRequested):
            await self.drop_channel(event.channel)
            self.conn.channel_close_ok(event.channel)
        elif isinstance(event, ChannelClosed):
            await self.drop_channel(event.channel)
        elif isinstance(event, ConnectionCloseSent | ConnectionClosed | HeartbeatTimeout):
            if isinstance(event, ConnectionCloseSent):
                self.close_reason = event.error.reply_text
            elif isinstance(event, ConnectionClosed) and not self.close_reason:
                self.close_reason = (
                    f"client closed: {event.reply_code} {event.reply_text}".rstrip()
                    if event.by_client
                    else event.reply_text
                )
            await self.release()

    async def fail(self, channel: ChannelState, error: AMQPError) -> None:
        """A soft error closes the channel, a hard one the connection."""
        if error.hard:
            self.close_reason = error.reply_text
            self.conn.close(error)
            await self.release()
        else:
            await self.drop_channel(channel.number)
            self.conn.close_channel(channel.number, error)

    async def _on_channel(
        self, number: int, method: Any, handle: Callable[[ChannelState], Awaitable[None]]
    ) -> None:
        """``handle`` on channel ``number`` if it is open, its failure reported on it as its
        ``method``'s: an AMQP error as is, Redis or a broker group away as such, anything
        else logged and answered with 541."""
        channel = self.channels.get(number)
        if channel is None or channel.closing:
            return
        try:
            await handle(channel)
        except AMQPError as error:
            await self.fail(channel, error)
        except MetaError as error:  # a metadata call outside meta_call (Redis away, say)
            index = method.index
            await self.fail(channel, amqp_error(error, index >> 16, index & 0xFFFF))
        except BrokerUnavailable as error:  # the queue's broker group is down
            await self._broker_unavailable(channel, method, error)
        except Exception:
            log.exception(
                "connection %s: internal error handling %s",
                self.id,
                method,
                extra={"connection": self.name},
            )
            await self.fail(channel, InternalError("internal error, see the server log"))

    async def _broker_unavailable(
        self, channel: ChannelState, method: Any, error: BrokerUnavailable
    ) -> None:
        """404, worded as RabbitMQ answers for a queue whose home node is down."""
        log.warning("connection %s: %s: %s", self.id, method.name, error,
                    extra={"connection": self.name})  # fmt: skip
        queue = getattr(method, "queue", None)
        vhost = self.vhost.name if self.vhost is not None else "/"
        reason = (
            f"home node of queue '{queue}' in vhost '{vhost}' is down or inaccessible"
            if queue
            else "home node of the queue is down or inaccessible"
        )
        index = method.index
        await self.fail(channel, NotFound(reason, index >> 16, index & 0xFFFF))

    # -- publishing -----------------------------------------------------------------------

    def read_size(self, default: int) -> int:
        """Bytes to read at once: little while publish limits apply, so that one read cannot
        hold many seconds' worth of a slow rate (the rate is paid after each read)."""
        return default if self.publish_limits is None else THROTTLED_READ_SIZE

    async def confirm_loop(self) -> None:
        """Send publisher confirms in order, each once its batch is durable."""
        async with self.confirm_receive:
            async for tags, end_offset, stored in self.confirm_receive:
                ok = stored
                if ok and end_offset:
                    try:
                        started = time.perf_counter()
                        await self.node.store.wait_durable(end_offset)
                        self.node.stats.durable_wait.observe(time.perf_counter() - started)
                    except StoreError as error:
                        log.error(
                            "connection %s: confirms fail: %s",
                            self.id,
                            error,
                            extra={"connection": self.name},
                        )
                        ok = False
                send_confirms(self.conn, self.node.stats, tags, ok)
                if self.tap is not None:
                    self.tap.confirmed(tags, ok)
                self.mark_dirty()

    # -- settling -------------------------------------------------------------------------

    def settle(
        self,
        channel: ChannelState,
        deliveries: list[Delivery],
        requeue: bool | None,
        backoff: bool = True,
    ) -> None:
        """Ack (requeue None), or nack/reject with or without requeue.

        ``backoff``: a requeue from a queue in backoff mode waits on the redelivery ladder
        (false for what a closing channel or basic.recover gives back)."""
        woken: set[QueueRuntime]
        if self.tap is not None:
            self.tap.settled(deliveries, requeue)
        if requeue is None:  # acks, the common case (settle_acks.py, compiled where built)
            self.node.stats.ack += len(deliveries)
            woken = settle_acks.picked_settle(deliveries)
        else:
            woken = set()
            for delivery in deliveries:
                queue = delivery.queue
                if requeue and backoff and queue.behaviour.redelivery == "backoff":
                    assert self.vhost is not None
                    self.node.back_off(self.vhost, queue, delivery.partition, delivery.message)
                elif requeue:
                    queue.requeue(delivery.partition, delivery.message)
                else:
                    queue.reject(delivery.partition, delivery.message)
                if delivery.consumer is not None:
                    delivery.consumer.unacked -= 1
                woken.add(queue)
        if channel.prefetch_global:
            woken.update(channel.queues_with_consumers())
        wake = self.node.scheduler.wake
        for queue in settle_acks.picked_worth_a_turn(woken):
            wake(queue)

    def requeue_unacked(self, channel: ChannelState) -> None:
        """Every delivery the channel holds goes back, redelivered (recover, channel close)."""
        deliveries = list(channel.unacked.values())
        channel.unacked.clear()
        self.settle(channel, deliveries, requeue=True, backoff=False)

    def cancel_consumer(self, consumer: Consumer) -> None:
        channel = consumer.channel
        channel.consumers.pop(consumer.tag, None)
        consumer.queue.remove_consumer(consumer)

    async def drop_channel(self, number: int) -> None:
        """The channel is gone: requeue its unacked deliveries, remove its consumers."""
        channel = self.channels.pop(number, None)
        if channel is None:
            return
        channel.closing = True
        if channel.reply_key:
            self.node.direct_replies.unregister(channel.reply_key)
        for consumer in list(channel.consumers.values()):
            self.cancel_consumer(consumer)
            await self.maybe_auto_delete(consumer.queue)
        self.requeue_unacked(channel)

    async def maybe_auto_delete(self, queue: QueueRuntime) -> None:
        if queue.definition.auto_delete and not queue.consumers and not queue.deleted:
            assert self.vhost is not None
            await self.vhost.delete_queue(queue.name, None, check=False)

    async def release(self) -> None:
        """Connection over (closed, failed or timed out): give back everything it held."""
        if self.closing:
            return
        self.closing = True
        for number in list(self.channels):
            await self.drop_channel(number)
        if self.tap is not None:
            self.tap.close()
        if self.vhost is not None:
            try:
                deletions = await self.node.meta.delete_exclusive_queues(self.owner_id)
            except MetadataUnavailable as error:
                log.warning("connection %s: its exclusive queues go once the metadata store is "
                            "back: %s", self.id, error)  # fmt: skip
                self.node.owners_to_clean.add(self.owner_id)
            else:
                await self.vhost.apply_deletions(deletions)
        await self.node.controls.session_closed(self)
        await count_out(self)
        if self.opened:
            self.node.open_connections -= 1
            log.info(
                "closing AMQP connection %s (%s)",
                self.id,
                self.close_reason or "closed",
                extra={"connection": self.name},
            )
        self.confirm_send.close()
