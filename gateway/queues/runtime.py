"""A queue's live state on this gateway: where each partition is read, what is buffered,
what is in flight, who consumes. Messages themselves stay in the log store.

Order: within a broker the commitlog offset is a total arrival order, so partitions are merged
by commit offset and deliveries follow publish order exactly, as RabbitMQ's would. Requeued
messages (nack/reject with requeue, or unacked at channel close) go to a heap ordered by commit
offset and are delivered before anything newer, flagged redelivered.
Committed offset per partition = the lowest offset not yet settled (at-least-once).

Queue features (gateway/queues/behaviour.py) are offset arithmetic and head operations here:
``ready_count``/``ready_bytes`` are kept exact as messages enter (counted at routing), leave
for a consumer, come back, expire or overflow, so max-length checks and message counts never
ask the store. Messages leave from the head only (expiry, drop-head), as in RabbitMQ; a message
leaving with a dead-letter exchange configured goes to the node's dead-letter outbox.

``QueueRuntime`` holds the delivery (take, the push scheduler's pump, write-through) and the
queue's behaviour and consumers, over mixins that share its fields (queue_state.py): the
FIFO store layout (held_messages.py), reads from the store (store_reads.py), settlement and
committed offsets (settlement.py), cluster delivery leases (leases.py), a scaled queue's
route (scaled_route.py) and what a publish asks of it (intake.py). It is composed with the
objects and modules for the rest, given or built once: who gets the next message
(``choice``: consumer_choice.py, single_active.py), departures (``dead_letters``:
dead_lettering.py), length limits and drop-head (``limits``: length_limits.py), TTL at the
head (expiry.py), bulk moves of the positions (retention, purge, reset: repositioning.py). A
store layout other than FIFO overrides the head and buffer operations (``_pop_head``,
``_peek_head``, ``_fetch_head``, ``_return``, ``fill``, ``absorb``, ``_held_bytes``,
``_drop_held_before``): gateway/queues/priority.py.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING

from gateway.queues import repositioning
from gateway.queues.behaviour import QueueBehaviour, behaviour_of
from gateway.queues.breaker import breaker_for, note
from gateway.queues.clock import SYSTEM_CLOCK, Clock
from gateway.queues.consumer import DELIVERY_OVERHEAD_BYTES, LANE_ALL, Taken
from gateway.queues.consumer_choice import ConsumerChoice
from gateway.queues.dead_letter import DeadLetter
from gateway.queues.dead_lettering import DeadLettering, stamped
from gateway.queues.expiry import deadline_ms, expire_head
from gateway.queues.held_messages import HeldMessages
from gateway.queues.intake import PublishIntake
from gateway.queues.leases import DeliveryLeases
from gateway.queues.length_limits import LengthLimits
from gateway.queues.rate_limit import TokenBucket
from gateway.queues.scaled_route import ScaledRoute
from gateway.queues.settlement import Settlement
from gateway.queues.store_reads import StoreReads
from meta.models import QueueDef
from storage import StoredMessage, StorePort
from storage.record import EXPIRES, PERSISTENT, REDELIVERED

if TYPE_CHECKING:
    from gateway.queues.consumer import QueueConsumer as Consumer

# tuple.__new__ skips a NamedTuple's Python-level __new__ (a frame per message saved).
_make_tuple = tuple.__new__


class PumpResult(Enum):
    QUOTA_USED = 1  # more may be deliverable: serve again next turn
    NO_CREDIT = 2  # messages wait for a consumer with credit (an ack/consume wakes us)
    NO_MESSAGES = 3  # buffer empty (a fetch or a publish wakes us)
    PAUSED = 4  # consumption paused by an operator (resume wakes us)
    RATE_LIMITED = 5  # out of tokens (the scheduler's timer wakes us when one is back)


class QueueRuntime(
    PublishIntake, StoreReads, HeldMessages, Settlement, DeliveryLeases, ScaledRoute
):
    keyed = False  # partitions by message key (gateway/queues/ordered.py), not by channel
    dead_letters: DeadLettering  # outbox: the vhost's; None: dropped
    # The callbacks take the runtime (subclasses pass themselves, as QueueRuntime).
    wake: Callable[[QueueRuntime], None] | None
    on_exhausted: Callable[[QueueRuntime], None] | None

    def __init__(
        self,
        definition: QueueDef,
        store: StorePort,
        behaviour: QueueBehaviour | None = None,
        outbox: Callable[[DeadLetter], None] | None = None,
        wake: Callable[[QueueRuntime], None] | None = None,
        choice: ConsumerChoice | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(
            definition,
            store,
            behaviour or behaviour_of(definition.arguments),
            ConsumerChoice() if choice is None else choice,
            wake,
            clock,
        )
        self.plain = self._is_plain()
        self.dead_letters = DeadLettering(self, outbox)
        self.limits = LengthLimits(self)  # append limits, drop-head
        self.limits.send_append_limit()
        self._set_rejects()

    async def recount_bytes(self) -> None:
        """Sum the bodies of the ready messages (a read pass; only for byte-limited queues)."""
        await repositioning.recount_bytes(self)

    def set_behaviour(self, behaviour: QueueBehaviour) -> None:
        self.behaviour = behaviour
        self.plain = self._is_plain()
        self.limits.send_append_limit()
        self._set_rejects()

    def _set_rejects(self) -> None:
        """A publish asks this queue first when it may refuse (reject-publish, a breaker)."""
        b = self.behaviour
        self.breaker = breaker_for(b.breaker, b.max_length, self.breaker, self.clock.monotonic())
        self.rejects_publish = b.rejects_publish or (
            self.breaker is not None and not self.breaker.blocks
        )

    def breaker_refuses(self) -> bool:
        """A reject breaker refuses this publish: tripped, or (one node) tripped by it."""
        breaker = self.breaker
        if breaker is None or breaker.blocks:
            return False
        if self.leases is None:  # exact here: judged as the publish would count
            note(self, breaker.judge(self.ready_count + 1, self.clock.monotonic()))
        if breaker.tripped:
            breaker.refused += 1
        return breaker.tripped

    def spreads_delivery(self) -> bool:
        """Cluster: whether several gateways may deliver the queue at once, each its own
        partitions (gateway/cluster/delivery_spread.py). Only a FIFO queue of several
        partitions without gray lanes (gray_lanes.py), and nothing that orders or counts
        across its partitions on one gateway: limits, a single active consumer, delivery
        counts, broadcast."""
        return False

    def _is_plain(self) -> bool:
        """A one-partition classic FIFO queue without limits, TTL or delivery counting: a
        message into it when empty goes to the next consumer, nothing else happens to it."""
        b = self.behaviour
        arguments = self.definition.arguments
        return (
            type(self) is QueueRuntime
            and type(self.choice) is ConsumerChoice
            and self.partitions == 1
            and arguments.get("x-queue-type", "classic") == "classic"
            and not self.broadcast
            and not b.has_limits
            and b.breaker is None
            and b.message_ttl_ms is None
            and not b.counts_deliveries
        )

    # -- consumers ------------------------------------------------------------------------

    def touch(self) -> None:
        """The queue was used (a declare, a get, a consumer came or went): renews x-expires."""
        self.last_used = self.clock.monotonic()

    def add_consumer(self, consumer: Consumer) -> None:
        self.choice.add(consumer)
        self.touch()

    def remove_consumer(self, consumer: Consumer) -> None:
        wake = self.choice.remove(consumer)
        self.touch()
        if wake and self.wake is not None:
            self.wake(self)

    def consumers_changed(self) -> None:
        """A consumer's gray state changed (gateway/queues/gray_lanes.py sorts them again)."""

    @property
    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.consumers)

    @property
    def active_consumer(self) -> Consumer | None:
        """The single active consumer (gateway/queues/single_active.py); None for other queues."""
        return self.choice.active

    def activity_status(self, consumer: Consumer) -> str:
        """RabbitMQ's consumer ``activity_status`` (``up``, or single active / waiting)."""
        return self.choice.activity_status(consumer)

    # -- delivery -------------------------------------------------------------------------

    def take(
        self, now_ms: int | None = None, lane: int = LANE_ALL
    ) -> tuple[int, StoredMessage, bool] | None:
        """Next message to hand out: (partition, message, redelivered); ``lane``: from the
        gray or the normal partitions only (gateway/queues/gray_lanes.py).

        Expired messages met at the head on the way leave the queue (a TTL of 0 still lets a
        message go to a consumer that can take it at once, as in RabbitMQ).
        """
        behaviour = self.behaviour
        while True:
            taken = self._pop_head(lane)
            if taken is None:
                return None
            partition, message, redelivered = taken
            # One unpack for the fields read below (each attribute read is a lookup).
            offset, _, _, _, _, body, _, store_ts, flags = message
            leases = self.leases
            if leases is not None and (
                not leases[partition] or (self.leaving and partition in self.leaving)
            ):
                self.park(partition, message)  # its lease is on its way to another gateway
                continue
            if behaviour.message_ttl_ms is not None or flags & EXPIRES:
                deadline = deadline_ms(message, behaviour.message_ttl_ms)
                now = self.clock.wall_ms() if now_ms is None else now_ms
                if deadline is not None and deadline < now and deadline != store_ts:
                    self.leave(partition, message, "expired")
                    continue
            self.ready_count -= 1
            self.ready_bytes -= len(body)
            if offset < self.restart_below[partition] and not flags & PERSISTENT:
                self.commit_dirty = True  # a transient message from before the restart: gone
                continue
            self.inflight[partition].add(offset)
            if offset >= self.delivered_below[partition]:
                self.delivered_below[partition] = offset + 1
            if behaviour.counts_deliveries:
                message = stamped(message, self.returns.get((partition, offset), 0))
            redelivered = (
                redelivered or bool(flags & REDELIVERED) or offset < self.maybe_delivered[partition]
            )
            return partition, message, redelivered

    async def get(self, lane: int = LANE_ALL) -> tuple[int, StoredMessage, bool] | None:
        """basic.get: take the next message, reading from the store if need be (``lane``:
        the getter's, for a queue with gray partitions)."""
        self.getting += 1  # cluster: no lease hand-over while a get reads
        try:
            return await self._get(lane)
        finally:
            self.getting -= 1

    async def _get(self, lane: int = LANE_ALL) -> tuple[int, StoredMessage, bool] | None:
        taken = self.take(lane=lane)
        if taken is None and self.leases is not None:
            # Cluster: other gateways' publishes do not wake this one (only long-poll reads
            # for consumers do), so an empty buffer is looked up at the broker each time.
            self.exhausted = False
        while taken is None and not self.exhausted:
            await self.fill()
            taken = self.take(lane=lane)
        return taken

    def deliver_now(
        self,
        exchange: str,
        routing_key: str,
        properties: bytes,
        body: bytes | bytearray,
        now_ms: int,
    ) -> bool:
        """Write-through without the append: a transient message into an empty plain queue
        whose consumers are all no-ack goes to the next one with credit at once, as RabbitMQ
        hands it over without writing it; nothing is left to store or redeliver. False (the
        caller stores it as usual) if anything is pending here or nobody can take it now."""
        if (
            self.ready_count
            or not self.exhausted
            or self.buffer
            or self.requeued
            or self.paused
            or self.deleted
            or self.appending
            or (self.leases is not None and not all(self.leases))  # cluster: delivered elsewhere
            or not self.consumers
        ):
            return False
        consumers = self.consumers
        if not (consumers[0].no_ack if len(consumers) == 1 else all(c.no_ack for c in consumers)):
            return False
        consumer = self.next_consumer()
        if consumer is None:
            return False
        self.enqueued += 1
        self.delivered += 1
        fields = (
            self.cursors[0],  # not an offset in the store: nothing refers to it afterwards
            -1,
            exchange.encode(),
            routing_key.encode(),
            memoryview(properties),
            memoryview(body),
            now_ms,
            now_ms,
            0,
        )
        message: StoredMessage = _make_tuple(StoredMessage, fields)
        consumer.sink.deliver(consumer, self, 0, message, False)
        return True

    def pump(self, quota: int, now: float) -> PumpResult:
        """Deliver up to ``quota`` messages to consumers with credit (and within the rate)."""
        # Every may_serve says yes without leases (the embedded node): no call per turn there.
        if self.paused or (self.leases is not None and not self.may_serve()):
            return PumpResult.PAUSED
        limit = self.rate_limit
        if limit is not None:
            quota = min(quota, limit.available(now))
            if quota <= 0:
                self.rate_wake_at = limit.next_token_at(now)
                return PumpResult.RATE_LIMITED
        byte_limit = self.byte_limit
        if byte_limit is not None and byte_limit.available(now) < 1:
            self.rate_wake_at = byte_limit.next_token_at(now)
            return PumpResult.RATE_LIMITED
        before = self.delivered
        result = self._pump(quota, byte_limit, now)
        if limit is not None:
            limit.take(self.delivered - before, now)
        return result

    def _pump(self, quota: int, byte_limit: TokenBucket | None, now: float) -> PumpResult:
        delivered = 0
        # The wall clock only where a queue TTL is read at the head; take() reads it for a
        # message of its own expiration (most queues have neither: no call per turn).
        now_ms = self.clock.wall_ms() if self.behaviour.message_ttl_ms is not None else None
        next_consumer = self.next_consumer
        while delivered < quota:
            if not self.has_buffered():
                return PumpResult.NO_MESSAGES
            consumer = next_consumer()
            if consumer is None:
                return self._no_consumer_ready()
            if byte_limit is None and len(self.consumers) == 1:
                # One consumer: what it may take in a row goes as one run (the same
                # deliveries as one at a time, without a choice and a call per message).
                run = self._take_run(consumer, quota - delivered, now_ms)
                if not run:
                    return PumpResult.NO_MESSAGES
                consumer.sink.deliver_run(consumer, self, run)
                delivered += len(run)
                self.delivered += len(run)
                continue
            taken = self.take(now_ms)
            if taken is None:
                return PumpResult.NO_MESSAGES
            partition, message, redelivered = taken
            consumer.sink.deliver(consumer, self, partition, message, redelivered)
            delivered += 1
            self.delivered += 1
            if byte_limit is not None:
                byte_limit.take(len(message.body), now)
                if byte_limit.available(now) < 1:
                    self.rate_wake_at = byte_limit.next_token_at(now)
                    return PumpResult.RATE_LIMITED
        return PumpResult.QUOTA_USED

    def _take_run(self, consumer: Consumer, most: int, now_ms: int | None) -> list[Taken]:
        """The messages ``consumer`` (whose credit was just checked) takes in a row: up to
        its room, ending with the one that fills its connection's output (after which one
        at a time its credit would have ended there too)."""
        room = consumer.room(most)
        headroom = consumer.sink.byte_room()
        take = self.take
        run: list[Taken] = []
        spent = 0
        while len(run) < room:
            taken = take(now_ms)
            if taken is None:
                break
            run.append(taken)
            spent += len(taken[1].body) + DELIVERY_OVERHEAD_BYTES
            if spent > headroom:
                break
        return run

    def _no_consumer_ready(self) -> PumpResult:
        """No consumer can take a message: out of credit, or held by its connection's rate
        limit (then the scheduler wakes the queue when the first of them has a token)."""
        wake_at = self.choice.rate_wake_at()
        if wake_at is None:
            return PumpResult.NO_CREDIT
        self.rate_wake_at = wake_at
        return PumpResult.RATE_LIMITED

    # -- counts ---------------------------------------------------------------------------

    async def message_count(self) -> int:
        """Ready messages: buffered, requeued and not yet fetched (unacked excluded).

        Expired messages at the head leave first, so a count never includes them. In a
        cluster, a gateway that does not deliver the queue asks the broker (its own count
        does not see what other gateways published or consumed): what lies after the
        committed offsets, the holder's unacked deliveries included. The holder counts from
        its read positions against the broker's ends, since it never counted in at routing
        what other gateways published."""
        if not self.holds_all_leases():
            stats = await self.store.queue_stats(self.queue_id)
            return sum(s.ready for s in self.counted(stats.partitions))
        if self.behaviour.message_ttl_ms is not None or self.expirations_seen:
            await self.expire(self.clock.wall_ms())
        if self.leases is None:
            return self.ready_count
        return await self.ready_in_store()

    # -- bulk moves and departures at the head (repositioning.py, expiry.py, limits) --------

    def _lost_to_retention(self, count: int) -> None:
        """A read found ``count`` unread messages removed by the store's retention."""
        repositioning.lost_to_retention(self, count)

    async def drop_stored_before(self, cut_ts_ms: int, why: str) -> int:
        """Ready messages stored before ``cut_ts_ms`` leave without dead-lettering, as
        retention (gateway/queues/repositioning.py); returns how many."""
        return await repositioning.drop_stored_before(self, cut_ts_ms, why)

    async def reset_to_time(self, ts_ms: int) -> list[tuple[int, int]]:
        """Read again from the first message stored at or after ``ts_ms`` (RocketMQ's
        resetOffsetByTime, gateway/queues/repositioning.py): (from, to) per partition."""
        return await repositioning.reset_to_time(self, ts_ms)

    async def purge(self) -> int:
        return await repositioning.purge(self)

    async def expire(self, now_ms: int) -> int | None:
        """Drop expired messages from the head; returns the next head's deadline, if any."""
        return await expire_head(self, now_ms)

    async def enforce_limits(self) -> None:
        """drop-head: while over max-length or max-length-bytes, the oldest messages go."""
        await self.limits.enforce()
