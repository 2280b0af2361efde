"""One client connection's broker logic, between the sans-IO connection and the node.

The I/O shell (connection_io.py) feeds events in and writes what the connection queues.
Publishes that arrive together are routed one by one but stored as one batch, and their
confirms go through a FIFO pipeline: a confirm is sent only once its batch is durable, and
always after the confirms before it, so acks can be coalesced with multiple=true.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
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
    Publish,
    SecretUpdateRequested,
    ServerConnection,
    VHostOpenRequested,
    frame_writer,
)
from gateway.amqp.errors import InternalError, NotAllowed, NotFound
from gateway.amqp.sasl import EXTERNAL
from gateway.queues.consumer import LANE_NORMAL
from gateway.queues.rate_limit import Limits
from gateway.queues.runtime import QueueRuntime
from gateway.sessions.access import NO_GRANTS, Grants
from gateway.sessions.channel_state import ChannelState, Consumer, Delivery
from gateway.sessions.connection_limits import count_in, count_out
from gateway.sessions.handlers import handle_method
from gateway.sessions.publishing import route_publish
from gateway.sessions.taps import SessionTap, session_tap
from gateway.vhost import amqp_error
from meta.errors import MetadataUnavailable, MetaError
from storage import BrokerUnavailable, Record, StoredMessage, StoreError
from storage.record import PERSISTENT

if TYPE_CHECKING:
    from gateway.sessions.host import SessionHost
    from gateway.vhost import VirtualHost

log = logging.getLogger("mqgw.connection")

FLOW_WAIT_MAX_S = 1.0
THROTTLED_READ_SIZE = 4 << 10  # a read's size while publish limits apply
HIGH_WATER_BYTES = 4 << 20  # stop delivering to a connection whose output is this far behind
LOW_WATER_BYTES = 1 << 20

# (channel, tag, accepted) per publish, the batch's end offset, whether the store took it.
ConfirmItem = tuple[list[tuple[ChannelState, int, bool]], int, bool]


class Session:
    def __init__(self, node: SessionHost, conn: ServerConnection, peer: str, local: str) -> None:
        self.node = node
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
        self._confirm_send: MemoryObjectSendStream[ConfirmItem] = send
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
        self.dirty.set()

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
        tag = channel.record_delivery(consumer, queue, partition, message)
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
        self.pending_bytes += len(body) + 128
        if self.pending_bytes + self.sending_bytes > HIGH_WATER_BYTES:
            self.writable = False
        self.mark_dirty()

    # -- events ---------------------------------------------------------------------------

    async def handle_events(self, events: Iterable[Event]) -> None:
        batch: list[Publish] = []
        for event in events:
            if isinstance(event, Publish):
                batch.append(event)
                continue
            if batch:
                await self.publish_batch(batch)
                batch = []
            await self._handle(event)
        if batch:
            await self.publish_batch(batch)

    async def _handle(self, event: Event) -> None:
        if isinstance(event, ChannelMethod):
            channel = self.channels.get(event.channel)
            if channel is None or channel.closing:
                return
            try:
                await handle_method(self, channel, event.method)
            except AMQPError as error:
                await self.fail(channel, error)
            except MetaError as error:  # a metadata call outside meta_call (Redis away, say)
                index = event.method.index
                await self.fail(channel, amqp_error(error, index >> 16, index & 0xFFFF))
            except BrokerUnavailable as error:  # the queue's broker group is down
                await self._broker_unavailable(channel, event.method, error)
            except Exception:
                log.exception(
                    "connection %s: internal error handling %s",
                    self.id,
                    event.method,
                    extra={"connection": self.name},
                )
                await self.fail(channel, InternalError("internal error, see the server log"))
        elif isinstance(event, AuthRequested):
            await self._authenticate(event)
        elif isinstance(event, VHostOpenRequested):
            await self._open_vhost(event)
        elif isinstance(event, SecretUpdateRequested):
            self._update_secret(event)
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

    async def _authenticate(self, event: AuthRequested) -> None:
        if event.mechanism == EXTERNAL:  # a verified client certificate (its CN): no password
            user = await self.node.get_user(event.username) if event.username else None
        else:
            user = await self.node.authenticate(event.username, event.password)
        reason = ""
        if user is None:
            reason = f"user '{event.username}' - invalid credentials"
        elif event.username in self.node.settings.loopback_users and not _is_loopback(self.peer):
            reason = f"user '{event.username}' can only connect via localhost"
        if reason:
            log.warning(
                "connection %s: login refused: %s", self.id, reason, extra={"connection": self.name}
            )
            await self.handle_events(self.conn.reject_auth(reason))
            return
        self.user = event.username
        await self.handle_events(self.conn.accept_auth())

    async def _open_vhost(self, event: VHostOpenRequested) -> None:
        vhost = self.node.vhosts.get(event.vhost)
        if vhost is None:
            await self.handle_events(self.conn.reject_vhost())
            return
        limit = self.node.settings.max_connections
        if limit and self.node.open_connections >= limit:
            error = NotAllowed(
                f"access to vhost '{event.vhost}' refused for user '{self.user}': "
                f"connection limit ({limit}) is reached"
            )
            await self.handle_events(self.conn.reject_vhost(error))
            return
        refused = await count_in(self, vhost.name)  # RabbitMQ: before the access check
        if refused is not None:
            await self.handle_events(self.conn.reject_vhost(refused))
            return
        if not self.node.access.may_use_vhost(self.user, vhost.name):
            # rabbit_access_control:check_vhost_access/4: no permission entry in the vhost.
            error = NotAllowed(f"access to vhost '{vhost.name}' refused for user '{self.user}'")
            log.warning(
                "connection %s: %s", self.id, error.reply_text, extra={"connection": self.name}
            )
            await count_out(self)
            await self.handle_events(self.conn.reject_vhost(error))
            return
        # Decisions cached per resource; the object stays current across permission changes.
        self.grants = self.node.access.grants(self.user, vhost.name)
        # rabbit_channel:check_user_id_header/2 lets the 'impersonator' tag publish any
        # user-id; the tags are those of the login, as RabbitMQ keeps them on the connection.
        user = self.node.known_user(self.user)
        self.impersonator = user is not None and "impersonator" in user.tags
        self.vhost = vhost
        self.tap = session_tap(self)
        self.opened = True
        self.vhost_opened.set()
        self.node.controls.attach_session(self)
        self.node.gray.attach(self)
        self.node.open_connections += 1
        log.info(
            "accepting AMQP connection %s (user '%s', vhost '%s')",
            self.id,
            self.user,
            vhost.name,
            extra={"connection": self.name},
        )
        await self.handle_events(self.conn.accept_vhost())
        if self.node.alarms.blocked:
            self.conn.send_blocked(self.node.block_reason())

    def _update_secret(self, event: SecretUpdateRequested) -> None:
        """connection.update-secret, as rabbit_reader 3.10 answers it with its internal users.

        rabbit_access_control:update_state/2 passes the new secret only to backends whose
        state can expire (OAuth 2 tokens); rabbit_auth_backend_internal:state_can_expire()
        is false, so the user is kept as authenticated and update-secret-ok is sent whatever
        the secret. The refusal (530 NOT_ALLOWED, conn.refuse_secret_update) is for such
        backends, which mqgw does not have.
        """
        log.info(
            "connection %s: user '%s' updated secret, reason: %s",
            self.id,
            self.user,
            event.reason,
            extra={"connection": self.name},
        )
        self.conn.accept_secret_update()
        self.mark_dirty()

    # -- publishing -----------------------------------------------------------------------

    async def publish_batch(self, batch: list[Publish]) -> None:
        assert self.vhost is not None
        self.published = True
        records: list[Record] = []
        confirms: list[tuple[ChannelState, int, bool]] = []
        confirm_records: list[int] = []  # per confirm, its record's index (-1: none)
        woken: set[QueueRuntime] = set()
        now_ms = time.time_ns() // 1_000_000
        route_epoch = self.vhost.route_epoch
        for publish in batch:
            channel = self.channels.get(publish.channel)
            if channel is None or channel.closing:
                continue
            try:
                record, queues, routed, rejected, held = route_publish(
                    self, channel, publish, now_ms
                )
            except AMQPError as error:
                await self.fail(channel, error)
                continue
            if self.tap is not None:
                record = self.tap.published(channel, publish, record, queues, now_ms)
            if not routed and publish.mandatory:
                self._send_return(channel, publish)
            elif not routed:
                self.node.stats.drop_unroutable += 1
            if channel.tx_mode:
                if record is not None:
                    channel.tx_publishes.append(record)
                channel.tx_publishes.extend(held)
                continue
            if record is not None:
                records.append(record)
                woken.update(queues)
            records.extend(held)  # copies held by delayed exchanges bound to this one
            if channel.confirm_mode:
                confirms.append((channel, channel.next_publish_tag, not rejected))
                confirm_records.append(len(records) - 1 - len(held) if record is not None else -1)
                channel.next_publish_tag += 1
        end_offset, ok = 0, True
        counts = self.node.stats
        counts.publish += len(batch)
        counts.publish_confirm += len(confirms)
        if records:
            result = None
            for queue in woken:
                queue.appending += 1
            try:
                try:
                    started = time.perf_counter()
                    records = self.vhost.for_append(records, route_epoch)
                    result = await self.vhost.append_routed(records, wait_durable=False)
                    counts.append_latency.observe(time.perf_counter() - started)
                    counts.appended_records += len(records)
                    end_offset = result.end_offset
                except StoreError as error:
                    ok = False
                    log.error(
                        "connection %s: %d message(s) not stored: %s",
                        self.id,
                        len(records),
                        error,
                        extra={"connection": self.name},
                    )
                    self.vhost.count_out(records)
                await self.vhost.stored(woken, records, result)
            finally:
                for queue in woken:
                    queue.appending -= 1
            if end_offset >= self.node.next_resource_look:
                await self.node.look_at_resources(end_offset)
            if result is not None and result.refused:  # the broker's length limit: nack
                refused = {index for index, _, _ in result.refused}
                confirms = [
                    (channel, tag, accepted and index not in refused)
                    for (channel, tag, accepted), index in zip(
                        confirms, confirm_records, strict=True
                    )
                ]
        if self.tap is not None:
            self.tap.stored(ok)
        if confirms:
            if end_offset and self._transient_only(records):
                end_offset = 0  # nothing to make durable: confirmed once stored, as RabbitMQ
            await self._confirm_send.send((confirms, end_offset, ok))
        if self.publish_limits is not None:
            await self._hold_for_publish_rate(batch)
        for queue in woken:
            if queue.breaker is not None:
                await self._judge_breaker(queue)
            if queue.congested():
                self.node.stats.flow_holds_local += 1
                await self._wait_for_consumers(queue)
            elif (
                self.node.remote_backlog is not None
                and not queue.holds_all_leases()  # another gateway delivers: ask the broker
                and await self.node.remote_backlog.hold(queue, FLOW_WAIT_MAX_S)
            ):
                self.node.stats.flow_holds_remote += 1

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

    def _transient_only(self, records: list[Record]) -> bool:
        """A batch of transient messages only, on the embedded node: RabbitMQ confirms such
        messages without an fsync, and they do not outlive a restart there either. In a
        cluster every confirm waits for the broker (and its replicas): a failover must not
        take back what was confirmed."""
        if self.node.cluster is not None:
            return False
        return not any(record.flags & PERSISTENT for record in records)

    async def _hold_for_publish_rate(self, batch: list[Publish]) -> None:
        """Publish limits: the batch is paid for, and the connection is not read again until
        every bucket in scope has a token (its TCP window closes, as with RabbitMQ's credit
        flow: nothing refused or lost; its state is "flow" meanwhile)."""
        limits = self.publish_limits
        assert limits is not None
        limits.take_publishes(len(batch), sum(len(p.body) for p in batch))
        if limits.ready():
            return
        self.flow_holds += 1
        try:
            while not limits.ready() and limits is self.publish_limits:
                await anyio.sleep(max(0.0, limits.next_at() - limits.clock()))
        finally:
            self.flow_holds -= 1

    def read_size(self, default: int) -> int:
        """Bytes to read at once: little while publish limits apply, so that one read cannot
        hold many seconds' worth of a slow rate (the rate is paid after each read)."""
        return default if self.publish_limits is None else THROTTLED_READ_SIZE

    async def _judge_breaker(self, queue: QueueRuntime) -> None:
        """A depth breaker is judged after every append to its queue; a tripped ``block``
        one holds this connection (not read: its state is "flow") until it resets."""
        await self.node.breakers.judge(queue)
        breaker = queue.breaker
        if breaker is None or not (breaker.tripped and breaker.blocks):
            return
        self.flow_holds += 1
        try:
            await breaker.reset_signal().wait()
        finally:
            self.flow_holds -= 1

    async def _wait_for_consumers(self, queue: QueueRuntime) -> None:
        """Flow control: this connection is not read while a queue it publishes to is far
        behind its consumers (its TCP window closes, the publisher slows down), as RabbitMQ's
        credit flow does. Bounded, so a stuck queue cannot hold a publisher for good."""
        self.flow_holds += 1
        try:
            with anyio.move_on_after(FLOW_WAIT_MAX_S):
                await queue.caught_up_signal().wait()
        finally:
            self.flow_holds -= 1

    def _send_return(self, channel: ChannelState, publish: Publish) -> None:
        self.node.stats.return_unroutable += 1
        frames = frame_writer.return_(
            channel.number,
            312,
            "NO_ROUTE",
            publish.exchange,
            publish.routing_key,
            publish.properties_bytes,
            publish.body,
            self.conn.frame_max,
        )
        self.conn.send_frames(channel.number, frames)

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
                self._send_confirms(tags, ok)
                if self.tap is not None:
                    self.tap.confirmed(tags, ok)
                self.mark_dirty()

    def _send_confirms(self, tags: list[tuple[ChannelState, int, bool]], stored: bool) -> None:
        """Runs of acks or nacks per channel, each sent once for its last tag.

        As rabbit_channel does: a lone ack has multiple=false; a run of acks, and any nack
        (sent when every earlier tag is settled), have multiple=true.
        """
        runs: dict[ChannelState, tuple[bool, int, int]] = {}  # channel -> (ack?, first, last)
        for channel, tag, accepted in tags:
            ack = stored and accepted
            run = runs.get(channel)
            if run is not None and run[0] != ack:
                self._send_confirm_run(channel, *run)
                run = None
            runs[channel] = (ack, tag if run is None else run[1], tag)
        for channel, run in runs.items():
            self._send_confirm_run(channel, *run)

    def _send_confirm_run(self, channel: ChannelState, ack: bool, first: int, last: int) -> None:
        if ack:
            self.node.stats.confirm += last - first + 1
            self.conn.send_ack(channel.number, last, last != first)
        else:
            self.conn.send_nack(channel.number, last, True)

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
        woken: set[QueueRuntime] = set()
        if self.tap is not None:
            self.tap.settled(deliveries, requeue)
        if requeue is None:
            self.node.stats.ack += len(deliveries)
        for delivery in deliveries:
            queue = delivery.queue
            if requeue and backoff and queue.behaviour.redelivery == "backoff":
                assert self.vhost is not None
                self.node.back_off(self.vhost, queue, delivery.partition, delivery.message)
            elif requeue:
                delivery.queue.requeue(delivery.partition, delivery.message)
            elif requeue is None:
                delivery.queue.settle(delivery.partition, delivery.message)
            else:
                delivery.queue.reject(delivery.partition, delivery.message)
            if delivery.consumer is not None:
                delivery.consumer.unacked -= 1
            woken.add(delivery.queue)
        if channel.prefetch_global:
            woken.update(channel.queues_with_consumers())
        for queue in woken:
            if queue.may_deliver:  # an idle queue is woken by its next publish instead
                self.node.scheduler.wake(queue)

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
        self._confirm_send.close()


def _is_loopback(peer: str) -> bool:
    host = peer.rsplit(":", 1)[0].strip("[]")
    return host.startswith("127.") or host in ("::1", "localhost")
