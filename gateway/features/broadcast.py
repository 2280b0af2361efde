"""Broadcast consumption (``x-consume-mode: broadcast``): RocketMQ's BROADCASTING model.

Every consumer of a broadcast queue gets every message, each from its own position. A
consumer reads through its own ``BroadcastSubscription``: a QueueRuntime with its own cursors,
buffer, requeue heap and in-flight set, given its consumer as its consumer choice
(``SubscriberChoice``), that commits under its own consumer group, so the push
scheduler, prefetch, acks, nack/reject with requeue, no-ack and channel close treat it exactly
like a queue. The queue's own runtime keeps the consumer list (declare-ok counts, exclusivity,
if-unused, auto-delete, cancel on delete) but must not deliver to it: while it has consumers,
the push scheduler hands its wake-ups (publishes, resume) to their subscriptions
(``Broadcasts.wake_instead``, plugged in as ``PushScheduler.redirect``). The
queue's own group is never advanced by them.

Positions
- Group ``broadcast:{connection_name}:{consumer_tag}``, kept in the store like a queue's offsets
  (committed every second by the node's housekeeping and at a clean shutdown). Only a consumer
  whose connection sets ``connection_name`` and which chose its consumer tag can come back to
  its position; any other position lives in memory only, as nothing could resume it.
- A position the store has never seen starts at the queue's current end, as RocketMQ's default
  CONSUME_FROM_LAST_OFFSET does for a broadcasting consumer with no stored offset: it gets only
  what is published after it subscribed. The start is committed at once, so a reconnect
  resumes from there (messages published while it was away are delivered).
- The store answers a group it never saw with the partition's minimum, which a saved position
  can equal; so a marker offset under ``{group}$saved`` records that a position exists.
- A consumer tag and connection name can be used by one consumer at a time (403 otherwise).
- A position without a consumer stays in memory until its deliveries are settled and it is
  committed (a quick reconnect continues from memory), then only the store keeps it.

Message count of a broadcast queue: the ready messages of its furthest-behind subscription that
has a consumer, or 0 when nobody consumes. Pause and rate limits set on the queue apply to each
subscription: every consumer gets the full rate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gateway.amqp.errors import AccessRefused, NotFound
from gateway.queues.consumer_choice import ConsumerChoice
from gateway.queues.rate_limit import TokenBucket
from gateway.queues.runtime import PumpResult, QueueRuntime
from meta.errors import resource_name
from meta.models import QueueDef

if TYPE_CHECKING:
    from gateway.ports import ConnectionPort
    from gateway.queues.consumer import QueueConsumer as Consumer

CONSUME_MODE_ARG = "x-consume-mode"
BROADCAST = "broadcast"
CLUSTER = "cluster"
SAVED_MARK = 1 << 62  # far above any real offset: the store cannot answer it for an unseen group


def is_broadcast(definition: QueueDef) -> bool:
    return definition.arguments.get(CONSUME_MODE_ARG) == BROADCAST


def connection_name(client_properties: Mapping[str, Any]) -> str:
    name = client_properties.get("connection_name")
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return name if isinstance(name, str) else ""


class SubscriberChoice(ConsumerChoice):
    """A position's consumer choice: its own consumer, kept in the queue's list (shared:
    counts, exclusivity and auto-delete see every consumer)."""

    def __init__(self, consumers: list[Consumer]) -> None:
        super().__init__(consumers)
        self.consumer: Consumer | None = None

    def add(self, consumer: Consumer) -> None:
        self.consumer = consumer
        super().add(consumer)

    def remove(self, consumer: Consumer) -> bool:
        if self.consumer is consumer:
            self.consumer = None
        return super().remove(consumer)

    def next_consumer(self) -> Consumer | None:
        consumer = self.consumer
        return consumer if consumer is not None and consumer.has_credit() else None


class BroadcastSubscription(QueueRuntime):
    """One broadcast consumer's position in a queue (see the module docstring)."""

    def __init__(self, queue: QueueRuntime, group: str, persistent: bool) -> None:
        self.subscriber = SubscriberChoice(queue.consumers)
        super().__init__(queue.definition, queue.store, choice=self.subscriber, clock=queue.clock)
        self.queue = queue
        self.group = group
        self.persistent = persistent
        self.claimed = False  # a consumer holds this position (or is being given it)
        self._rate_source: TokenBucket | None = None

    async def start(self) -> None:
        store, queue_id = self.store, self.queue_id
        marker = f"{self.group}$saved"
        if self.persistent and await store.committed_offset(marker, queue_id, 0) >= SAVED_MARK:
            for p in range(self.partitions):
                self.cursors[p] = await store.committed_offset(self.group, queue_id, p)
            return
        stats = await store.queue_stats(queue_id)
        self.cursors = [s.max_offset for s in stats.partitions]
        if self.persistent:
            self.commit_dirty = True
            await self.commit()  # positions first: the marker never exists without them
            await store.commit_offset(marker, queue_id, 0, SAVED_MARK)

    @property
    def consumer(self) -> Consumer | None:
        return self.subscriber.consumer

    def remove_consumer(self, consumer: Consumer) -> None:
        if self.subscriber.consumer is consumer:
            self.claimed = False  # the position is free for its next consumer
        super().remove_consumer(consumer)

    async def fill(self) -> None:
        if self.consumer is not None:  # a position without a consumer reads nothing ahead
            await super().fill()

    def pump(self, quota: int, now: float) -> PumpResult:
        queue = self.queue
        if queue.paused:
            return PumpResult.PAUSED
        self.control_running = queue.control_running
        if queue.rate_limit is not self._rate_source:  # the operator changed the queue's limit
            source = self._rate_source = queue.rate_limit
            self.rate_limit = None if source is None else TokenBucket(source.rate_per_s, now)
        return super().pump(quota, now)

    async def message_count(self) -> int:
        """Ready for this consumer: not yet fetched, buffered or requeued (offset arithmetic)."""
        return await self.ready_in_store()

    @property
    def idle(self) -> bool:
        """No consumer, nothing in flight, nothing left to commit: only the store needs it."""
        settled = not any(self.inflight)
        return not self.claimed and settled and not (self.persistent and self.commit_dirty)

    async def commit(self) -> None:
        if not self.persistent or not self.commit_dirty or self.deleted:
            return
        self.commit_dirty = False
        for partition, offset in enumerate(self.committed_offsets()):
            await self.store.commit_offset(self.group, self.queue_id, partition, offset)


class Broadcasts:
    """The node's broadcast subscriptions: queue runtime -> group -> subscription."""

    def __init__(self) -> None:
        self.by_queue: dict[QueueRuntime, dict[str, BroadcastSubscription]] = {}

    async def consumer_queue(
        self, queue: QueueRuntime, connection: ConnectionPort, tag: str, tag_given: bool
    ) -> QueueRuntime:
        """What a new consumer of ``queue`` reads: the queue, or its own subscription."""
        if not is_broadcast(queue.definition):
            return queue
        name = connection_name(connection.client_properties)
        persistent = bool(name) and tag_given
        group = f"broadcast:{name if persistent else connection.id}:{tag}"
        return await self.subscribe(queue, group, persistent)

    async def subscribe(
        self, queue: QueueRuntime, group: str, persistent: bool
    ) -> BroadcastSubscription:
        subscriptions = self.by_queue.setdefault(queue, {})
        subscription = subscriptions.get(group)
        if subscription is None:
            subscription = BroadcastSubscription(queue, group, persistent)
            await subscription.start()
            if queue.deleted:
                where = resource_name("queue", queue.name, queue.definition.vhost)
                raise NotFound(f"no {where}", 60, 20)
            subscription = subscriptions.setdefault(group, subscription)
        if subscription.claimed:
            where = resource_name("queue", queue.name, queue.definition.vhost)
            raise AccessRefused(f"{where}: broadcast position '{group}' is in use", 60, 20)
        subscription.claimed = True
        subscription.exhausted = False  # messages may have come while nobody read it
        return subscription

    async def message_count(self, queue: QueueRuntime) -> int:
        if not is_broadcast(queue.definition):
            return await queue.message_count()
        subscriptions = self.by_queue.get(queue, {})
        counts = [await s.message_count() for s in list(subscriptions.values()) if s.claimed]
        return max(counts, default=0)

    async def purge(self, queue: QueueRuntime) -> int:
        """Purge ``queue``; a broadcast queue's subscriptions drop what they have not delivered."""
        if not is_broadcast(queue.definition):
            return await queue.purge()
        count = await self.message_count(queue)
        await queue.purge()
        stats = await queue.store.queue_stats(queue.queue_id)
        for subscription in self.by_queue.get(queue, {}).values():
            subscription.buffer.clear()
            subscription.requeued.clear()
            subscription.cursors = [s.max_offset for s in stats.partitions]
            subscription.commit_dirty = True
        return count

    async def commit(self) -> None:
        """Commit every position; forget the idle ones (the store keeps them)."""
        for subscriptions in list(self.by_queue.values()):
            for group, subscription in list(subscriptions.items()):
                await subscription.commit()
                if subscription.idle and subscriptions.get(group) is subscription:
                    del subscriptions[group]
                    subscription.deleted = True  # no more turns in the scheduler

    def wake_instead(self, queue: QueueRuntime) -> list[QueueRuntime] | None:
        """The push scheduler's redirect (``PushScheduler.redirect``): while a broadcast
        queue has consumers they read through their subscriptions, so what woke the queue (a
        publish, a resume) wakes each of them, and the queue must not deliver to them itself.
        None (wake the queue) for any other queue, or one without consumers."""
        subscriptions = self.by_queue.get(queue)
        if subscriptions is None or not queue.consumers:
            return None
        woken: list[QueueRuntime] = []
        for subscription in subscriptions.values():
            if subscription.consumer is not None:
                subscription.exhausted = False
                woken.append(subscription)
        return woken

    def queue_deleted(self, queue: QueueRuntime) -> None:
        for subscription in self.by_queue.pop(queue, {}).values():
            subscription.deleted = True  # its offsets went with the queue: nothing to commit
