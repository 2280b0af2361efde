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

The runtime holds the per-message core (read positions, buffer, requeue heap, in flight, the
exact counts, delivery) and is composed with the objects and modules for the rest, given or
built once: who gets the next message (``choice``: consumer_choice.py, single_active.py),
departures (``dead_letters``: dead_lettering.py), length limits and drop-head (``limits``:
length_limits.py), TTL at the head (expiry.py), bulk moves of the positions (retention,
purge, reset: repositioning.py). A store layout other than FIFO overrides the head and buffer
operations (``_pop_head``, ``_peek_head``, ``_fetch_head``, ``_return``, ``fill``, ``absorb``,
``_held_bytes``, ``_drop_held_before``): gateway/queues/priority.py.
"""

from __future__ import annotations

import heapq
import logging
import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any

import anyio

from gateway.amqp import Publish
from gateway.queues import repositioning
from gateway.queues.behaviour import QueueBehaviour, behaviour_of
from gateway.queues.breaker import DepthBreaker, breaker_for, note
from gateway.queues.clock import SYSTEM_CLOCK, Clock
from gateway.queues.consumer import LANE_ALL
from gateway.queues.consumer_choice import ConsumerChoice
from gateway.queues.dead_letter import DeadLetter
from gateway.queues.dead_lettering import DeadLettering, stamped
from gateway.queues.expiry import deadline_ms, expire_head
from gateway.queues.length_limits import LengthLimits
from gateway.queues.rate_limit import TokenBucket
from meta.channel_route import successor
from meta.cluster import HandedNote
from meta.models import QueueDef
from meta.queue_route import COMMAND_EXCHANGE, QueueRoute
from storage import (
    QUEUE_GROUP,
    DeliveryProgress,
    PartitionStats,
    ReadStatus,
    StoredMessage,
    StorePort,
)
from storage.errors import StaleFence, StoreError
from storage.record import EXPIRES, PERSISTENT, REDELIVERED

if TYPE_CHECKING:
    from gateway.queues.consumer import QueueConsumer as Consumer

log = logging.getLogger("mqgw.queue")
COMMAND = COMMAND_EXCHANGE.encode()  # a route change's command record: never delivered

FETCH_BATCH = 256
LOW_WATER = 64
# Publish flow control (RabbitMQ's credit flow, per queue): a publisher into a queue whose
# consumers could take messages but are this far behind is not read until they catch up.
FLOW_HIGH = 2_000
FLOW_LOW = 500


# tuple.__new__ skips a NamedTuple's Python-level __new__ (a frame per message saved).
_make_tuple = tuple.__new__


class PumpResult(Enum):
    QUOTA_USED = 1  # more may be deliverable: serve again next turn
    NO_CREDIT = 2  # messages wait for a consumer with credit (an ack/consume wakes us)
    NO_MESSAGES = 3  # buffer empty (a fetch or a publish wakes us)
    PAUSED = 4  # consumption paused by an operator (resume wakes us)
    RATE_LIMITED = 5  # out of tokens (the scheduler's timer wakes us when one is back)


class QueueRuntime:
    keyed = False  # partitions by message key (gateway/queues/ordered.py), not by channel

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
        self.definition = definition
        self.clock = clock  # the scheduler's: x-expires idle time and TTL deadlines
        self.name = definition.name
        self.queue_id = definition.queue_id
        self.partitions = definition.partitions
        # The gray partitions (gateway/queues/gray_lanes.py) and the rest; no gray ones: ().
        self.gray_parts: tuple[int, ...] = ()
        self.normal_parts: tuple[int, ...] = tuple(range(self.partitions))
        self.store = store
        self.behaviour = behaviour or behaviour_of(definition.arguments)
        # Who gets the next message (single active consumer is a choice too); the list is
        # the choice's, and next_consumer is bound once: a delivery costs one call there.
        self.choice = ConsumerChoice() if choice is None else choice
        self.consumers = self.choice.consumers
        self.next_consumer: Callable[[], Consumer | None] = self.choice.next_consumer
        # The depth breaker (gateway/queues/breaker.py), if its policy has one.
        self.breaker: DepthBreaker | None = None
        self.rejects_publish = False  # read per publish: a plain field (_set_rejects)
        self.plain = self._is_plain()  # may deliver_now (read per publish: a plain field)
        self.dead_letters = DeadLettering(self, outbox)  # outbox: the vhost's; None: dropped
        # The push scheduler's wake (None in unit tests): for what the queue itself decides
        # may let it deliver, such as another consumer becoming the single active one.
        self.wake = wake
        self.cursors = [0] * self.partitions  # next offset to fetch, per partition
        # Below these offsets a message may have gone out before a crash or a stop: flagged
        # redelivered (gateway/queues/delivery_marks.py carries them across a clean stop).
        self.maybe_delivered = [0] * self.partitions
        self.delivered_below = [0] * self.partitions  # past the highest offset delivered
        # Below these offsets a message was stored before the store last opened: a transient
        # one there is gone, as RabbitMQ loses non-persistent messages when it restarts.
        self.restart_below = [0] * self.partitions
        # Cluster mode: per partition, whether this gateway holds its delivery lease (None:
        # embedded, always delivers). See gateway/cluster/link.py.
        self.leases: list[bool] | None = None
        self.fences = [0] * self.partitions  # the lease's fencing token, sent with commits
        # Cluster: called when a fill reached the end of every partition (long-poll reads).
        self.on_exhausted: Callable[[QueueRuntime], None] | None = None
        self.last_get = -1e9  # event-loop time of the last basic.get (cluster: lease kept)
        self.getting = 0  # basic.gets under way (cluster: the leases are not handed over)
        # Attached while its broker group was down (cluster): not started, not delivered,
        # until VirtualHost.start_waiting finds the group back.
        self.waiting_for_broker = False
        # A plain queue that was scaled runs on its route (meta/channel_route.py): publishers
        # write to ``write_parts`` only (empty: every partition, the queue never scaled).
        self.route: QueueRoute | None = None
        self.write_parts: tuple[int, ...] = ()
        self.read_parts: Sequence[int] = range(self.partitions)  # all but removed ones
        self.started = False  # no route-driven moves of the cursors before start sets them
        # Cluster: removed partitions whose committed offset in the store lies below their
        # command record (a broker failover lost the last commits): held a moment to commit
        # past it, or they would hold the log back for good (RouteKeeper.check_removed).
        self.behind_removed: set[int] = set()
        self.buffer: deque[tuple[int, StoredMessage]] = deque()
        self.requeued: list[tuple[int, int, StoredMessage]] = []  # (commit offset, partition, m)
        self.inflight: list[set[int]] = [set() for _ in range(self.partitions)]
        self.returns: dict[tuple[int, int], int] = {}  # (partition, offset) -> times requeued
        self.exhausted = False  # last fetch found nothing new
        self.fed = False  # just took the batch in hand up to the store's end (absorb)
        # Publishes on their way into the store (a session's batch between routing and
        # VirtualHost.stored), and appends that reached it so far: a read that began before
        # an append ended may have missed it, so it is not the end (_read_partitions), and
        # nothing bypasses the store (deliver_now) while one is out: order is kept.
        self.appending = 0
        self.appends_done = 0
        self.scheduled = False  # in the push scheduler's ready set or being served
        self.rewake = False
        self.deleted = False
        self.commit_dirty = False
        # Consumption controls (gateway/controls.py): the queue's own stop/run and limits.
        self.paused = False
        self.control_running = False  # its control says run: wider stops do not apply here
        self.rate_limit: TokenBucket | None = None
        self.byte_limit: TokenBucket | None = None
        self.rate_wake_at = 0.0  # when a rate-limited pump may deliver again
        self.parked_until = 0.0  # scheduler clock time of this queue's pending timer, if any
        self.caught_up_event: anyio.Event | None = None  # publishers waiting (flow control)
        self.last_used = clock.monotonic()  # for x-expires (touch() renews it)
        # Exact counts: published = ready + unacked + acked + dead_lettered + dropped.
        self.ready_count = 0
        self.ready_bytes = 0
        self.enqueued = 0
        self.acked = 0
        self.dead_lettered = 0
        self.dropped = 0  # expired or overflowed with no dead-letter exchange
        self.dropped_by_retention = 0  # unread messages the store's retention removed
        self.rejected_publishes = 0  # refused by x-overflow reject-publish(-dlx)
        self.held_for_retry = 0  # nacked in backoff mode, timer record not yet stored
        self.retried = 0  # left for the redelivery timer (they re-enter as new messages)
        self.expirations_seen = False  # some message here has its own expiration
        self.delivered = 0  # total deliveries (consumers and basic.get), for stats and tests
        self.limits = LengthLimits(self)  # append limits, drop-head
        self.limits.send_append_limit()
        self._set_rejects()

    async def start(self) -> None:
        """Resume from the committed offsets: what was in flight at a stop is redelivered."""
        ready = 0
        marks = await self.store.unclean_marks(self.queue_id)
        restarted = await self.store.restart_marks(self.queue_id)
        for p in range(self.partitions):
            self.cursors[p] = await self.store.committed_offset(QUEUE_GROUP, self.queue_id, p)
            self.maybe_delivered[p] = marks.get(p, 0)
            self.restart_below[p] = restarted.get(p, 0)
        stats = await self.store.queue_stats(self.queue_id)
        for s in self.known(stats.partitions):
            self.cursors[s.partition] = max(self.cursors[s.partition], s.min_offset)
            ready += max(0, s.max_offset - self.cursors[s.partition])
        self.ready_count = ready
        if self.behaviour.max_length_bytes is not None:
            await self.recount_bytes()
        self.started = True
        self.pass_removed_records()

    async def leave_lost_transients(self) -> None:
        """After start (embedded node): transient messages stored before the store opened are
        gone, as RabbitMQ loses them at a restart, and fill drops them from the count. One
        fill now, so the count leaves out those among the first FETCH_BATCH per partition
        (read into the buffer, as a consumer's first turn would). The index entries do not
        say which records are persistent, so an exact count would read every record stored
        before the restart: those past the first batch leave the count as later fills reach
        them. (Cluster: a gateway not holding the lease reads the broker's count.)"""
        if any(c < r for c, r in zip(self.cursors, self.restart_below, strict=True)):
            await self.fill()

    async def recount_bytes(self) -> None:
        """Sum the bodies of the ready messages (a read pass; only for byte-limited queues)."""
        await repositioning.recount_bytes(self)

    async def _held_bytes(self) -> int:
        """Body bytes of the ready messages read from the store already."""
        total = sum(len(m.body) for _, m in self.buffer)
        return total + sum(len(m.body) for _, _, m in self.requeued)

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
            and arguments.get("x-consume-mode") != "broadcast"
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

    def pick_partition(self, gray: bool = False) -> int:
        """Where a message without a sticky channel goes: any partition (delivery merges
        them by commit offset), or, where the queue has gray ones, one of its lane's."""
        if self.write_parts:  # scaled: the open ones
            return random.choice(self.write_parts)
        if self.partitions == 1:
            return 0
        if self.gray_parts:
            return random.choice(self.gray_parts if gray else self.normal_parts)
        return random.randrange(self.partitions)

    def successor(self, partition: int) -> int:
        """A scaled queue: where a channel whose ``partition`` closed writes from now on."""
        if self.route is None or partition in self.write_parts:
            return partition
        return successor(self.route, partition)

    def key_partition(self, routing_key: str, headers: Mapping[str, Any] | None) -> int:
        """A keyed-order queue's partition for a message (gateway/queues/ordered.py)."""
        raise NotImplementedError("only a keyed-order queue partitions by key")

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

    # -- counting in ----------------------------------------------------------------------

    def count_in(self, body_size: int, record_flags: int = 0) -> None:
        """A message was routed here (counted before its append; count_out if that fails)."""
        self.ready_count += 1
        self.ready_bytes += body_size
        self.enqueued += 1
        if record_flags & EXPIRES:
            self.expirations_seen = True

    def dead_letter_publish(self, publish: Publish, properties: bytes, record_flags: int) -> None:
        """reject-publish-dlx: the refused message goes to the dead-letter exchange."""
        self.dead_letters.refused_publish(publish, properties, record_flags)

    def count_out(self, body_size: int) -> None:
        self.ready_count -= 1
        self.ready_bytes -= body_size
        self.enqueued -= 1

    def congested(self) -> bool:
        """Far behind while a consumer could take messages: its publishers should wait."""
        return self.ready_count > FLOW_HIGH and self.choice.any_can_take()

    def caught_up_signal(self) -> anyio.Event:
        if self.caught_up_event is None:
            self.caught_up_event = anyio.Event()
        return self.caught_up_event

    def release_publishers(self) -> None:
        """Called by the push scheduler after a turn: wake publishers once below FLOW_LOW,
        or when nobody can take messages now (waiting would not help)."""
        event = self.caught_up_event
        if event is not None:
            self.caught_up_event = None
            event.set()

    def would_overflow(self, body_size: int) -> bool:
        """reject-publish: would one more message of this size pass a limit?"""
        if self.leases is not None:
            # Cluster: the broker counts both limits at the append (this gateway's counts
            # see neither the others' publishes nor their consumers' acks).
            return False
        b = self.behaviour
        if b.max_length is not None and self.ready_count + 1 > b.max_length:
            return True
        return b.max_length_bytes is not None and self.ready_bytes + body_size > b.max_length_bytes

    def over_limit(self) -> bool:
        b = self.behaviour
        if b.max_length is not None and self.ready_count > b.max_length:
            return True
        return b.max_length_bytes is not None and self.ready_bytes > b.max_length_bytes

    # -- messages -------------------------------------------------------------------------

    def has_buffered(self) -> bool:
        return bool(self.requeued or self.buffer)

    @property
    def may_deliver(self) -> bool:
        """Messages buffered or still in the store: worth a turn when credit comes back."""
        return self.has_buffered() or not self.exhausted

    def _pop_head(self, lane: int = LANE_ALL) -> tuple[int, StoredMessage, bool] | None:
        """The head (``lane``: of those partitions, for a queue with gray partitions)."""
        if self.requeued:
            _, partition, message = heapq.heappop(self.requeued)
            return partition, message, True
        if self.buffer:
            partition, message = self.buffer.popleft()
            return partition, message, False
        return None

    def _peek_head(self) -> StoredMessage | None:
        if self.requeued:
            return self.requeued[0][2]
        if self.buffer:
            return self.buffer[0][1]
        return None

    def take(
        self, now_ms: int | None = None, lane: int = LANE_ALL
    ) -> tuple[int, StoredMessage, bool] | None:
        """Next message to hand out: (partition, message, redelivered); ``lane``: from the
        gray or the normal partitions only (gateway/queues/gray_lanes.py).

        Expired messages met at the head on the way leave the queue (a TTL of 0 still lets a
        message go to a consumer that can take it at once, as in RabbitMQ).
        """
        while True:
            taken = self._pop_head(lane)
            if taken is None:
                return None
            partition, message, redelivered = taken
            if self.behaviour.message_ttl_ms is not None or message.flags & EXPIRES:
                deadline = deadline_ms(message, self.behaviour.message_ttl_ms)
                now = self.clock.wall_ms() if now_ms is None else now_ms
                if deadline is not None and deadline < now and deadline != message.store_ts_ms:
                    self.leave(partition, message, "expired")
                    continue
            self.ready_count -= 1
            self.ready_bytes -= len(message.body)
            if (
                message.queue_offset < self.restart_below[partition]
                and not message.flags & PERSISTENT
            ):
                self.commit_dirty = True  # a transient message from before the restart: gone
                continue
            offset = message.queue_offset
            self.inflight[partition].add(offset)
            if offset >= self.delivered_below[partition]:
                self.delivered_below[partition] = offset + 1
            if self.behaviour.counts_deliveries:
                returned = self.returns.get((partition, message.queue_offset), 0)
                message = stamped(message, returned)
            return (
                partition,
                message,
                redelivered
                or bool(message.flags & REDELIVERED)
                or message.queue_offset < self.maybe_delivered[partition],
            )

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

    async def fill(self) -> None:
        """Fetch from the store when the buffer runs low (batched; merged by commit offset)."""
        if len(self.buffer) >= LOW_WATER:
            return
        if self.fed:  # once: what absorb took reached the store's end, so a read finds nothing
            self.fed = False
            if self.exhausted:
                return
        # Not caught up while a read is in flight: a remote read yields, and an append
        # absorbed meanwhile (caught_up) would come back in this read too, twice.
        self.exhausted = False
        read, ends, more = await self._read_partitions(self.read_parts)
        self.buffer.extend(read if self.route is None else self._without_commands(read))
        self._filled(ends, more)

    def _without_commands(
        self, read: Iterable[tuple[int, StoredMessage]]
    ) -> list[tuple[int, StoredMessage]]:
        """A scaled queue: the command records closing its partitions are never delivered
        (counted ready until read, as a start counts them from the store's ends)."""
        kept = []
        for item in read:
            if item[1].exchange == COMMAND:
                self.ready_count -= 1
                self.commit_dirty = True
            else:
                kept.append(item)
        return kept

    async def _read_partitions(
        self, partitions: Iterable[int]
    ) -> tuple[Iterable[tuple[int, StoredMessage]], list[tuple[int, int, int]], bool]:
        """One batch from each of ``partitions`` past its cursor, merged by commit offset;
        the (partition, min, end) each read saw; whether any has more past the batch."""
        fetched: list[list[tuple[int, StoredMessage]]] = []
        ends: list[tuple[int, int, int]] = []  # (partition, min, end) as this fill's reads saw
        appends_done = self.appends_done
        more = False
        for p in partitions:
            start, fence = self.cursors[p], self.fences[p]
            try:
                # Cluster: with the lease's token, so that once another gateway has taken the
                # partition over this one reads nothing more to deliver (StaleFence).
                result = await self.store.read(self.queue_id, p, start, FETCH_BATCH, fence=fence)
            except StaleFence as error:
                self.lose_lease(p, error, fence)
                continue
            if self.cursors[p] != start:
                # Moved while the read was out (a delivery-lease take-over, a reset): this
                # answer is for the old position; taking it would skip what lies between.
                more = True
                continue
            if result.status is ReadStatus.MOVED:
                repositioning.lost_to_retention(self, result.min_offset - self.cursors[p])
            self.cursors[p] = result.next_offset
            ends.append((p, result.min_offset, result.max_offset))
            more = more or result.next_offset < result.max_offset
            if result.messages:
                messages = result.messages
                if start < self.restart_below[p]:
                    messages = self._without_lost_transients(p, messages)
                fetched.append([(p, m) for m in messages])
        more = more or self.appends_done != appends_done  # one landed behind a read: look again
        if len(fetched) <= 1:
            return (fetched[0] if fetched else ()), ends, more
        return heapq.merge(*fetched, key=lambda pm: pm[1].commit_offset), ends, more

    def _filled(self, ends: list[tuple[int, int, int]], more: bool) -> None:
        # Reached the end of every partition: nothing to fetch until a publish wakes us
        # (saves an empty turn per message when thousands of queues each get a trickle).
        self.exhausted = not more
        if not more and self.on_exhausted is not None:
            self.on_exhausted(self)
        if self.leases is not None:
            # Cluster: other gateways' publishes were never counted in here at routing, so
            # the count comes from the ends this fill saw (flow control and drop-head read
            # it); ready_bytes stays this gateway's own view.
            self.ready_count = self._ready_at(ends)

    def _without_lost_transients(
        self, partition: int, messages: list[StoredMessage]
    ) -> list[StoredMessage]:
        """``messages`` less the transient ones stored before this start: they are gone, as
        RabbitMQ loses them at a restart, and leave the ready count here, not at take."""
        below = self.restart_below[partition]
        kept: list[StoredMessage] = []
        for message in messages:
            if message.queue_offset < below and not message.flags & PERSISTENT:
                self.ready_count -= 1
                self.ready_bytes -= len(message.body)
                self.commit_dirty = True  # the committed offset may pass it now
            else:
                kept.append(message)
        return kept

    def _ready_at(self, ends: Iterable[tuple[int, int, int]]) -> int:
        """Ready messages, given the store's (partition, min offset, end offset): what lies
        past this queue's read positions, and what it holds in hand (buffer, requeued)."""
        unfetched = sum(max(0, end - max(self.cursors[p], low)) for p, low, end in ends)
        return unfetched + self.held_count()

    def held_count(self) -> int:
        """Messages read from the store and not handed out (buffered or requeued)."""
        return len(self.buffer) + len(self.requeued)

    def held(self) -> Iterator[tuple[int, StoredMessage]]:
        """Those messages, as (partition, message)."""
        yield from self.buffer
        for _, partition, message in self.requeued:
            yield partition, message

    def clear_held(self) -> None:
        """Forget what was read and not handed out (purge, reset: positions move)."""
        self.buffer.clear()
        self.requeued.clear()

    async def ready_in_store(self) -> int:
        """``_ready_at`` against the store's current ends (a store call)."""
        stats = await self.store.queue_stats(self.queue_id)
        return self._ready_at(
            (s.partition, s.min_offset, s.max_offset) for s in self.known(stats.partitions)
        )

    def counted(self, parts: Sequence[PartitionStats]) -> Sequence[PartitionStats]:
        """The partitions whose ready messages are the queue's (all it knows; a removed
        one counts nothing: what it held before its command record was settled, though its
        committed offset on a new broker master may lag: commits replicate after the fact)."""
        if self.route is None:
            return self.known(parts)
        return [s for s in self.known(parts) if not self.is_removed(s.partition)]

    def known(self, parts: Sequence[PartitionStats]) -> Sequence[PartitionStats]:
        """The store's partitions this runtime knows: on a cluster a keyed-order queue's
        store queue grows (a rescale on another gateway) before its route reaches here."""
        return parts if len(parts) <= self.partitions else parts[: self.partitions]

    def caught_up(self, starts: Mapping[tuple[int, int], int]) -> bool:
        """Whether messages appended at ``starts`` are the very next ones to read here, and
        worth holding now: the queue has consumers and has read all partitions to the end."""
        if not self.exhausted or not self.consumers or self.deleted or self.paused:
            return False
        if self.leases is not None and not all(self.leases):
            return False  # cluster: another gateway delivers it, or take_over is under way
        if self.definition.arguments.get("x-consume-mode") == "broadcast":
            return False  # its consumers read through their own positions
        if len(self.buffer) >= LOW_WATER:
            return False
        qid = self.queue_id
        cursors = self.cursors
        if len(cursors) == 1:
            return starts.get((qid, 0), cursors[0]) == cursors[0]
        return all(starts.get((qid, p), cursor) == cursor for p, cursor in enumerate(cursors))

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

    def absorb(self, messages: list[tuple[int, StoredMessage]]) -> bool:
        """Take just-appended messages from the batch in hand (see caught_up)."""
        if len(self.buffer) + len(messages) > FETCH_BATCH:
            return False
        self.buffer.extend(messages)
        cursors = self.cursors
        if len(cursors) == 1:
            cursors[0] += len(messages)
        else:
            for partition, _ in messages:
                cursors[partition] += 1
        self.fed = True
        return True

    async def drop_stored_before(self, cut_ts_ms: int, why: str) -> int:
        """Ready messages stored before ``cut_ts_ms`` leave without dead-lettering, as
        retention (gateway/queues/repositioning.py); returns how many."""
        return await repositioning.drop_stored_before(self, cut_ts_ms, why)

    async def _drop_held_before(self, cut_ts_ms: int) -> tuple[int, bool]:
        """Drop the read ready messages stored before ``cut_ts_ms``: (how many, whether
        ready_bytes was kept exact)."""
        dropped = 0
        kept: deque[tuple[int, StoredMessage]] = deque()
        for partition, message in self.buffer:
            if message.store_ts_ms < cut_ts_ms:
                dropped += 1
                self.ready_bytes -= len(message.body)
                self.returns.pop((partition, message.queue_offset), None)
            else:
                kept.append((partition, message))
        self.buffer = kept
        requeued = [item for item in self.requeued if item[2].store_ts_ms >= cut_ts_ms]
        for _, partition, message in self.requeued:
            if message.store_ts_ms < cut_ts_ms:
                dropped += 1
                self.ready_bytes -= len(message.body)
                self.returns.pop((partition, message.queue_offset), None)
        heapq.heapify(requeued)
        self.requeued = requeued
        return dropped, True

    # -- leaving --------------------------------------------------------------------------

    def settle(self, partition: int, message: StoredMessage) -> None:
        """Ack, or a no-ack delivery: the message is done."""
        self.inflight[partition].discard(message.queue_offset)
        self.returns.pop((partition, message.queue_offset), None)
        self.commit_dirty = True
        self.acked += 1

    def reject(self, partition: int, message: StoredMessage) -> None:
        """Reject or nack without requeue: dead-lettered (reason rejected) or dropped."""
        self.inflight[partition].discard(message.queue_offset)
        self.dead_letters.gone(partition, message, "rejected")

    def leave(self, partition: int, message: StoredMessage, reason: str) -> None:
        """A ready message leaves from the head: expired, maxlen (drop-head)."""
        self.ready_count -= 1
        self.ready_bytes -= len(message.body)
        self.dead_letters.gone(partition, message, reason)

    # -- redelivery backoff (gateway/features/redelivery.py) ------------------------------

    def hold_for_retry(self, partition: int, message: StoredMessage) -> None:
        """Nacked in backoff mode: stays in flight until its timer record is stored."""
        self.held_for_retry += 1

    def retry_stored(self, partition: int, message: StoredMessage) -> None:
        self.held_for_retry -= 1
        self.inflight[partition].discard(message.queue_offset)
        self.commit_dirty = True
        self.retried += 1

    def retry_failed(self, partition: int, message: StoredMessage) -> None:
        self.held_for_retry -= 1
        self.requeue(partition, message)

    def give_up(self, partition: int, message: StoredMessage) -> None:
        """Past x-max-redeliveries: to the dead-letter exchange, or the queue's .dlq."""
        self.inflight[partition].discard(message.queue_offset)
        self.dead_letters.gone(partition, message, "delivery_limit", to_dlq=True)

    def requeue(self, partition: int, message: StoredMessage) -> None:
        if self.deleted:
            return
        self.inflight[partition].discard(message.queue_offset)
        limit = self.behaviour.delivery_limit
        if limit is not None:
            key = (partition, message.queue_offset)
            returned = self.returns.get(key, 0) + 1
            if returned > limit:
                self.dead_letters.gone(partition, message, "delivery_limit")
                return
            self.returns[key] = returned  # take() stamps it on the next delivery
        self.ready_count += 1
        self.ready_bytes += len(message.body)
        self._return(partition, message)
        # Committed at the next pass (the offset may not move): in a cluster the progress
        # report sent with it counts the message ready again at the broker, where the other
        # gateways read their counts; at a shutdown, that final commit is the last report.
        self.commit_dirty = True

    def _return(self, partition: int, message: StoredMessage) -> None:
        """Back in the queue, before every newer message (RabbitMQ keeps its place)."""
        heapq.heappush(self.requeued, (message.commit_offset, partition, message))

    async def expire(self, now_ms: int) -> int | None:
        """Drop expired messages from the head; returns the next head's deadline, if any."""
        return await expire_head(self, now_ms)

    async def _fetch_head(self, always: bool) -> StoredMessage | None:
        """The next message to leave, read from the store if need be (None: no message).
        ``always``: read even if the last fetch reached the end (messages may have been
        appended since, before the wake-up that would say so)."""
        head = self._peek_head()
        if head is None and (always or not self.exhausted):
            await self.fill()
            head = self._peek_head()
        return head

    async def enforce_limits(self) -> None:
        """drop-head: while over max-length or max-length-bytes, the oldest messages go."""
        await self.limits.enforce()

    def pump(self, quota: int, now: float) -> PumpResult:
        """Deliver up to ``quota`` messages to consumers with credit (and within the rate)."""
        if self.paused or not self.may_serve():
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
        now_ms = self.clock.wall_ms()
        next_consumer = self.next_consumer
        while delivered < quota:
            if not self.has_buffered():
                return PumpResult.NO_MESSAGES
            consumer = next_consumer()
            if consumer is None:
                return self._no_consumer_ready()
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

    def _no_consumer_ready(self) -> PumpResult:
        """No consumer can take a message: out of credit, or held by its connection's rate
        limit (then the scheduler wakes the queue when the first of them has a token)."""
        wake_at = self.choice.rate_wake_at()
        if wake_at is None:
            return PumpResult.NO_CREDIT
        self.rate_wake_at = wake_at
        return PumpResult.RATE_LIMITED

    # -- counts and offsets ---------------------------------------------------------------

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

    # -- cluster delivery leases ------------------------------------------------------------

    def start_leasing(self) -> None:
        """Cluster: nothing is delivered before this gateway holds a partition's lease."""
        self.leases = [False] * self.partitions

    def holds_all_leases(self) -> bool:
        """Cluster: the leases of every partition that may still deliver."""
        if self.leases is None:
            return True
        if self.route is None:
            return all(self.leases)
        return all(held or self.is_removed(p) for p, held in enumerate(self.leases))

    def may_serve(self) -> bool:
        """Whether this gateway delivers anything of the queue now (cluster: its leases;
        a queue with gray partitions: those of one lane are enough)."""
        return self.holds_all_leases()

    def wants_partition(self, partition: int) -> bool:
        """Whether a consumer here reads ``partition`` (cluster: worth holding its lease).
        A scaled queue: the lowest partition not removed first, the others by its holder
        (one gateway delivers the whole queue: a partition opened by a grow goes to it)."""
        if self.route is None or partition in self.behind_removed:
            return bool(self.consumers)
        if not self.consumers or self.is_removed(partition):
            return False
        lead = next((p.partition for p in self.route.partitions if p.state != "removed"), 0)
        return partition == lead or self.holds_lease(lead)

    def holds_lease(self, partition: int) -> bool:
        return self.leases is None or self.leases[partition]

    def set_lease(self, partition: int, held: bool) -> None:
        if self.leases is not None:
            self.leases[partition] = held

    async def take_over(self, partition: int, handed: HandedNote | None = None) -> None:
        """This gateway now delivers ``partition``: start from the broker's committed offset
        (another gateway may have delivered and committed meanwhile) and flag as redelivered
        what may have gone out before (``_delivered_before``: what the last holder's note
        says, checked against the broker's fence). The read registers the lease's fencing
        token (``fences``, set by the cluster link): the holder replaced can commit no more
        (StaleFence)."""
        # The fence the last holder left (0: nobody ever held it), read before ours goes in.
        before = (await self.store.queue_stats(self.queue_id)).partitions[partition]
        committed = await self.store.committed_offset(
            QUEUE_GROUP, self.queue_id, partition, self.fences[partition]
        )
        # From here on the replaced holder's reads are refused: it can have read nothing past
        # the end these stats give, so that is how far "may have gone out" reaches.
        stats = await self.store.queue_stats(self.queue_id)
        # Dropped after the reads (which yield): the partition is read again from committed.
        self._forget_partition(partition)
        part = stats.partitions[partition]
        self.cursors[partition] = max(committed, part.min_offset)
        self.maybe_delivered[partition] = _delivered_before(before, handed, part.max_offset)
        self.ready_count = (
            sum(
                max(0, s.max_offset - self.cursors[s.partition])
                for s in self.known(stats.partitions)
            )
            + self.held_count()
        )
        self.exhausted = False
        self.set_lease(partition, True)
        if self.is_removed(partition):  # taken only to commit past its command record
            self.pass_removed_records()
            await self.commit()
            self.behind_removed.discard(partition)

    # -- a scaled queue's route (meta/channel_route.py, gateway/vhost/rescale.py) -----------

    def set_route(self, route: QueueRoute) -> None:
        """A new version, or a partition's state changed: publishers write to the open
        partitions, readers read every partition not removed (a new one from its start)."""
        self.route = route
        self.grow_partitions(len(route.partitions))
        self.write_parts = tuple(route.open_partitions())
        self.read_parts = route.read_partitions()
        self.plain = self._is_plain()
        if self.started:
            self.pass_removed_records()
            self.exhausted = False
            if self.wake is not None:
                self.wake(self)

    def grow_partitions(self, partitions: int) -> None:
        """The store queue gained partitions: every per-partition list reaches the count."""
        more = partitions - self.partitions
        if more <= 0:
            return
        self.partitions = partitions
        self.read_parts = range(partitions)  # (a route sets its own after)
        for values in (self.cursors, self.maybe_delivered, self.delivered_below,
                       self.restart_below, self.fences):  # fmt: skip
            values.extend([0] * more)
        self.inflight.extend(set() for _ in range(more))
        if self.leases is not None:
            self.leases.extend([False] * more)

    def is_removed(self, partition: int) -> bool:
        route = self.route
        return (
            route is not None
            and partition < len(route.partitions)
            and route.partitions[partition].state == "removed"
        )

    def command_appended(self, partition: int) -> None:
        """A change appended its command record to ``partition``: read up to it (it is
        counted ready until read, as a start counts it from the store's ends)."""
        self.ready_count += 1
        self.exhausted = False
        if self.started and self.wake is not None:
            self.wake(self)

    def pass_removed_records(self) -> None:
        """A removed partition drained before anyone read its command record (nobody needs
        to): read positions move past it, and it leaves the ready count."""
        if self.route is None:
            return
        for part in self.route.partitions:
            if part.state != "removed" or part.closed_at is None:
                continue
            p = part.partition
            if self.cursors[p] <= part.closed_at and not self._holds_of(p):
                self.ready_count -= part.closed_at + 1 - self.cursors[p]
                self.cursors[p] = part.closed_at + 1
                self.commit_dirty = True

    def _holds_of(self, partition: int) -> bool:
        """Messages of ``partition`` read and not handed out."""
        return any(p == partition for p, _ in self.buffer) or any(
            p == partition for _, p, _ in self.requeued
        )

    async def commit_partition(self, partition: int) -> bool:
        """The last commit of ``partition`` before its lease goes (it is no longer marked
        held, which ``commit`` skips): False if the broker refused the fence (the lease was
        lost meanwhile). StoreError if the broker is away."""
        progress = self.delivery_progress()
        report = progress[partition] if progress is not None else None
        offset, fence = self.committed_offsets()[partition], self.fences[partition]
        try:
            await self.store.commit_offset(
                QUEUE_GROUP, self.queue_id, partition, offset, fence, report
            )
        except StaleFence as error:
            self.lose_lease(partition, error, fence)
            return False
        return True

    async def hand_over(self, partition: int) -> int:
        """This gateway stops delivering ``partition`` (after its final commit; the lease goes
        to another gateway): what it holds of it is dropped and its cursor goes back to the
        committed offset (a later commit here cannot move past what it dropped). Returns the
        note for the next holder: the offset below which a message may have gone out and is
        not settled (from here, or from a holder before, as the take-over learnt it)."""
        committed = self.committed_offsets()[partition]
        self._forget_partition(partition)
        self.cursors[partition] = committed
        self.set_lease(partition, False)
        return max(self.maybe_delivered[partition], self.delivered_below[partition], committed)

    def _forget_partition(self, partition: int) -> None:
        """Drop what was read of ``partition`` and not handed out (or handed back)."""
        self.buffer = deque(item for item in self.buffer if item[0] != partition)
        requeued = [item for item in self.requeued if item[1] != partition]
        heapq.heapify(requeued)
        self.requeued = requeued

    async def reset_to_time(self, ts_ms: int) -> list[tuple[int, int]]:
        """Read again from the first message stored at or after ``ts_ms`` (RocketMQ's
        resetOffsetByTime, gateway/queues/repositioning.py): (from, to) per partition."""
        return await repositioning.reset_to_time(self, ts_ms)

    async def purge(self) -> int:
        return await repositioning.purge(self)

    def committed_offsets(self) -> list[int]:
        lowest = list(self.cursors)
        for partition, message in self.buffer:
            lowest[partition] = min(lowest[partition], message.queue_offset)
        for _, partition, message in self.requeued:
            lowest[partition] = min(lowest[partition], message.queue_offset)
        for partition, offsets in enumerate(self.inflight):
            if offsets:
                lowest[partition] = min(lowest[partition], *offsets)
        return lowest

    async def report_progress(self) -> None:
        """Commit now, changed or not: refreshes the progress report (delivery_progress)
        that other gateways count and hold their publishers by."""
        self.commit_dirty = True
        await self.commit()

    async def commit(self) -> None:
        if not self.commit_dirty or self.deleted:
            return
        self.commit_dirty = False
        progress = self.delivery_progress()
        for partition, offset in enumerate(self.committed_offsets()):
            if self.leases is not None and not self.leases[partition]:
                # Cluster: the holder commits it. What is left here (a late ack after the
                # partition was handed over or lost) must not move its position, and an
                # unfenced commit (0 after lose_lease) would be admitted.
                continue
            fence = self.fences[partition]
            report = progress[partition] if progress is not None and fence else None  # held
            try:
                await self.store.commit_offset(
                    QUEUE_GROUP, self.queue_id, partition, offset, fence, report
                )
            except StaleFence as error:
                self.lose_lease(partition, error, fence)
            except StoreError:
                self.commit_dirty = True  # the broker is away: the next pass commits
                raise

    def delivery_progress(self) -> list[DeliveryProgress] | None:
        """Per partition where this gateway stands, for the store's ready counts and the
        flow control of the gateways that publish here (cluster only: an embedded node
        counts for itself). None where positions are not a single cursor (priority)."""
        if self.leases is None:
            return None
        behind = [0] * self.partitions
        for partition, _ in self.buffer:
            behind[partition] += 1
        for _, partition, _ in self.requeued:
            behind[partition] += 1
        # As congested() asks: a consumer this queue's choice would deliver to has credit.
        takers = (
            sum(1 for c in self.consumers if c.has_credit()) if self.choice.any_can_take() else 0
        )
        return [DeliveryProgress(at, behind[p], takers) for p, at in enumerate(self.cursors)]

    def delivery_marks(self) -> dict[int, int]:
        """Per partition where a message below may have been delivered and is not settled
        (past the committed offset): what the next start must flag redelivered."""
        committed = self.committed_offsets()
        marks = (max(pair) for pair in zip(self.maybe_delivered, self.delivered_below, strict=True))
        return {p: mark for p, mark in enumerate(marks) if mark > committed[p]}

    def lose_lease(self, partition: int, error: StaleFence, fence: int) -> None:
        """The broker refused fencing token ``fence`` on a commit or a read: another gateway
        took the partition over (our lease lapsed while we were paused or cut off from
        Redis). Stop delivering it; what our consumers hold unacked is redelivered from
        there. A call that went out with an older token than ours (this gateway took the
        lease again meanwhile: ours may be the one that shut it out) tells nothing."""
        if fence == 0 or fence != self.fences[partition]:
            return
        log.warning(
            "queue %r partition %d: fencing token refused (%s); lease token %d replaced, "
            "no longer delivering this partition",
            self.name,
            partition,
            error,
            self.fences[partition],
        )
        self.fences[partition] = 0
        self.set_lease(partition, False)


def _delivered_before(part: PartitionStats, handed: HandedNote | None, end: int) -> int:
    """Below which offset of a partition just taken over a message may have been delivered
    (cluster): nothing if no gateway ever took it over (no fence at the broker, no note in
    Redis); the mark its last holder left when it gave the lease up cleanly, if the broker's
    highest fence is that holder's (so nobody took it over since, even if Redis lost the
    newer note); otherwise (the lease lapsed, the note is gone) everything up to ``end``
    (the partition's end once the new token shut the last holder out)."""
    if handed is None and part.fence == 0:
        return 0
    if handed is not None and handed.mark is not None and handed.token == part.fence:
        return handed.mark
    return end
