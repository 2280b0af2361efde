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
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from typing import TYPE_CHECKING

import anyio

from gateway.amqp import Publish
from gateway.amqp import property_bytes as pb
from gateway.queues.behaviour import QueueBehaviour, behaviour_of
from gateway.queues.dead_letter import DeadLetter
from gateway.queues.rate_limit import TokenBucket
from meta.models import QueueDef
from storage import QUEUE_GROUP, ReadStatus, StoredMessage, StorePort
from storage.errors import StaleFence
from storage.record import PERSISTENT

if TYPE_CHECKING:
    from gateway.queues.consumer import QueueConsumer as Consumer

log = logging.getLogger("mqgw.queue")

FETCH_BATCH = 256
LOW_WATER = 64
# Publish flow control (RabbitMQ's credit flow, per queue): a publisher into a queue whose
# consumers could take messages but are this far behind is not read until they catch up.
FLOW_HIGH = 2_000
FLOW_LOW = 500
EXPIRATION_FLAG = 2  # the message carries an expiration property
REDELIVERED_FLAG = 4  # re-entered its queue after a redelivery backoff


DLQ_SUFFIX = ".dlq"
DELIVERY_COUNT = "x-delivery-count"


# tuple.__new__ skips a NamedTuple's Python-level __new__ (a frame per message saved).
_make_tuple = tuple.__new__


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def message_expiration(message: StoredMessage) -> int | None:
    """The per-message TTL in ms, read from the property bytes only when flagged."""
    if not message.flags & EXPIRATION_FLAG:
        return None
    try:
        raw = pb.split_properties(message.properties).get(pb.EXPIRATION)
        value = pb.shortstr_value(raw)
        return None if value is None else int(value)
    except ValueError:
        return None


class PumpResult(Enum):
    QUOTA_USED = 1  # more may be deliverable: serve again next turn
    NO_CREDIT = 2  # messages wait for a consumer with credit (an ack/consume wakes us)
    NO_MESSAGES = 3  # buffer empty (a fetch or a publish wakes us)
    PAUSED = 4  # consumption paused by an operator (resume wakes us)
    RATE_LIMITED = 5  # out of tokens (the scheduler's timer wakes us when one is back)


class QueueRuntime:
    def __init__(
        self,
        definition: QueueDef,
        store: StorePort,
        behaviour: QueueBehaviour | None = None,
        outbox: Callable[[DeadLetter], None] | None = None,
        wake: Callable[[QueueRuntime], None] | None = None,
    ) -> None:
        self.definition = definition
        self.name = definition.name
        self.queue_id = definition.queue_id
        self.partitions = definition.partitions
        self.store = store
        self.behaviour = behaviour or behaviour_of(definition.arguments)
        self.rejects_publish = self.behaviour.rejects_publish  # read per publish: a plain field
        self.plain = self._is_plain()  # may deliver_now (read per publish: a plain field)
        self.outbox = outbox  # where dead letters go (the vhost's); None: dropped
        # The push scheduler's wake (None in unit tests): for what the queue itself decides
        # may let it deliver, such as another consumer becoming the single active one.
        self.wake = wake
        self.consumers: list[Consumer] = []
        self._rr = 0
        self.cursors = [0] * self.partitions  # next offset to fetch, per partition
        # Below these offsets a message may have gone out before a crash: flagged redelivered.
        self.maybe_delivered = [0] * self.partitions
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
        self.buffer: deque[tuple[int, StoredMessage]] = deque()
        self.requeued: list[tuple[int, int, StoredMessage]] = []  # (commit offset, partition, m)
        self.inflight: list[set[int]] = [set() for _ in range(self.partitions)]
        self.returns: dict[tuple[int, int], int] = {}  # (partition, offset) -> times requeued
        self.exhausted = False  # last fetch found nothing new
        self.fed = False  # just took the batch in hand up to the store's end (absorb)
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
        self.last_used = time.monotonic()  # for x-expires
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
        self._limit_sent: int | None = None
        self._send_limit()

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
        for s in stats.partitions:
            self.cursors[s.partition] = max(self.cursors[s.partition], s.min_offset)
            ready += max(0, s.max_offset - self.cursors[s.partition])
        self.ready_count = ready
        if self.behaviour.max_length_bytes is not None:
            await self.recount_bytes()

    async def recount_bytes(self) -> None:
        """Sum the bodies of the ready messages (a read pass; only for byte-limited queues)."""
        total = await self._held_bytes()
        for p in range(self.partitions):
            offset = self.cursors[p]
            while True:
                result = await self.store.read(self.queue_id, p, offset, FETCH_BATCH)
                if not result.messages:
                    break
                total += sum(len(m.body) for m in result.messages)
                offset = result.next_offset
        self.ready_bytes = total

    async def _held_bytes(self) -> int:
        """Body bytes of the ready messages read from the store already."""
        total = sum(len(m.body) for _, m in self.buffer)
        return total + sum(len(m.body) for _, _, m in self.requeued)

    def set_behaviour(self, behaviour: QueueBehaviour) -> None:
        self.behaviour = behaviour
        self.rejects_publish = behaviour.rejects_publish
        self.plain = self._is_plain()
        self._send_limit()

    def _send_limit(self) -> None:
        """x-max-length reject-publish travels with appends to a shared broker, which
        refuses what would pass it (the embedded store leaves it to would_overflow)."""
        b = self.behaviour
        limit = b.max_length if b.rejects_publish else None
        if limit != self._limit_sent:
            self._limit_sent = limit
            self.store.set_append_limit(self.queue_id, limit)

    def _is_plain(self) -> bool:
        """A one-partition classic FIFO queue without limits, TTL or delivery counting: a
        message into it when empty goes to the next consumer, nothing else happens to it."""
        b = self.behaviour
        arguments = self.definition.arguments
        return (
            type(self) is QueueRuntime
            and self.partitions == 1
            and arguments.get("x-queue-type", "classic") == "classic"
            and arguments.get("x-consume-mode") != "broadcast"
            and not b.has_limits
            and b.message_ttl_ms is None
            and not b.counts_deliveries
        )

    # -- consumers ------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self.last_used = time.monotonic()

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        self.last_used = time.monotonic()

    @property
    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.consumers)

    @property
    def active_consumer(self) -> Consumer | None:
        """The single active consumer (gateway/queues/single_active.py); None for other queues."""
        return None

    def activity_status(self, consumer: Consumer) -> str:
        """RabbitMQ's consumer ``activity_status``: every consumer of other queues is up."""
        return "up"

    def next_consumer(self) -> Consumer | None:
        """Round-robin among the highest-priority consumers that have credit."""
        consumers = self.consumers
        n = len(consumers)
        if n == 1:  # the common case, without the loop (same outcome)
            consumer = consumers[0]
            if consumer.has_credit():
                self._rr = 1
                return consumer
            return None
        best: Consumer | None = None
        best_index = 0
        for k in range(n):
            index = (self._rr + k) % n
            consumer = consumers[index]
            if (best is None or consumer.priority > best.priority) and consumer.has_credit():
                best, best_index = consumer, index
        if best is not None:
            self._rr = best_index + 1
        return best

    # -- counting in ----------------------------------------------------------------------

    def count_in(self, body_size: int, record_flags: int = 0) -> None:
        """A message was routed here (counted before its append; count_out if that fails)."""
        self.ready_count += 1
        self.ready_bytes += body_size
        self.enqueued += 1
        if record_flags & EXPIRATION_FLAG:
            self.expirations_seen = True

    def dead_letter_publish(self, publish: Publish, properties: bytes, record_flags: int) -> None:
        """reject-publish-dlx: the refused message goes to the dead-letter exchange."""
        b = self.behaviour
        if b.dlx is None or self.outbox is None:
            return
        self.outbox(
            DeadLetter(
                self.name,
                "maxlen",
                publish.exchange,
                publish.routing_key,
                properties,
                bytes(publish.body),
                bool(record_flags & PERSISTENT),
                b.dlx,
                b.dlrk,
            )
        )

    def count_out(self, body_size: int) -> None:
        self.ready_count -= 1
        self.ready_bytes -= body_size
        self.enqueued -= 1

    def congested(self) -> bool:
        """Far behind while a consumer could take messages: its publishers should wait."""
        return self.ready_count > FLOW_HIGH and any(c.has_credit() for c in self.consumers)

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
        b = self.behaviour
        # Cluster: the broker counts for max-length at the append (this gateway's count
        # does not see the others' publishes); max-length-bytes stays a local check.
        if self.leases is None and b.max_length is not None and self.ready_count + 1 > b.max_length:
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

    def _pop_head(self) -> tuple[int, StoredMessage, bool] | None:
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

    def deadline(self, message: StoredMessage) -> int | None:
        """When ``message`` expires (wall ms), from the queue TTL and its own expiration."""
        ttl = self.behaviour.message_ttl_ms
        own = message_expiration(message)
        if own is not None:
            ttl = own if ttl is None else min(ttl, own)
        return None if ttl is None else message.store_ts_ms + ttl

    def take(self, now_ms: int | None = None) -> tuple[int, StoredMessage, bool] | None:
        """Next message to hand out: (partition, message, redelivered).

        Expired messages met at the head on the way leave the queue (a TTL of 0 still lets a
        message go to a consumer that can take it at once, as in RabbitMQ).
        """
        while True:
            taken = self._pop_head()
            if taken is None:
                return None
            partition, message, redelivered = taken
            if self.behaviour.message_ttl_ms is not None or message.flags & EXPIRATION_FLAG:
                deadline = self.deadline(message)
                now = wall_ms() if now_ms is None else now_ms
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
            self.inflight[partition].add(message.queue_offset)
            if self.behaviour.counts_deliveries:
                returned = self.returns.get((partition, message.queue_offset), 0)
                message = _stamped(message, returned)
            return (
                partition,
                message,
                redelivered
                or bool(message.flags & REDELIVERED_FLAG)
                or message.queue_offset < self.maybe_delivered[partition],
            )

    async def get(self) -> tuple[int, StoredMessage, bool] | None:
        """basic.get: take the next message, reading from the store if need be."""
        taken = self.take()
        while taken is None and not self.exhausted:
            await self.fill()
            taken = self.take()
        return taken

    async def fill(self) -> None:
        """Fetch from the store when the buffer runs low (batched; merged by commit offset)."""
        if len(self.buffer) >= LOW_WATER:
            return
        if self.fed:  # once: what absorb took reached the store's end, so a read finds nothing
            self.fed = False
            if self.exhausted:
                return
        fetched: list[list[tuple[int, StoredMessage]]] = []
        ends: list[tuple[int, int, int]] = []  # (partition, min, end) as this fill's reads saw
        more = False
        # Not caught up while a read is in flight: a remote read yields, and an append
        # absorbed meanwhile (caught_up) would come back in this read too, twice.
        self.exhausted = False
        for p in range(self.partitions):
            start = self.cursors[p]
            result = await self.store.read(self.queue_id, p, start, FETCH_BATCH)
            if self.cursors[p] != start:
                # Moved while the read was out (a delivery-lease take-over, a reset): this
                # answer is for the old position; taking it would skip what lies between.
                more = True
                continue
            if result.status is ReadStatus.MOVED:
                self._lost_to_retention(result.min_offset - self.cursors[p])
            self.cursors[p] = result.next_offset
            ends.append((p, result.min_offset, result.max_offset))
            more = more or result.next_offset < result.max_offset
            if result.messages:
                fetched.append([(p, m) for m in result.messages])
        # Reached the end of every partition: nothing to fetch until a publish wakes us
        # (saves an empty turn per message when thousands of queues each get a trickle).
        self.exhausted = not more
        if not more and self.on_exhausted is not None:
            self.on_exhausted(self)
        if fetched:
            if len(fetched) == 1:
                self.buffer.extend(fetched[0])
            else:
                self.buffer.extend(heapq.merge(*fetched, key=lambda pm: pm[1].commit_offset))
        if self.leases is not None:
            # Cluster: other gateways' publishes were never counted in here at routing, so
            # the count comes from the ends this fill saw (flow control and drop-head read
            # it); ready_bytes stays this gateway's own view.
            self.ready_count = self._ready_at(ends)

    def _ready_at(self, ends: Iterable[tuple[int, int, int]]) -> int:
        """Ready messages, given the store's (partition, min offset, end offset): what lies
        past this queue's read positions, and what it holds in hand (buffer, requeued)."""
        unfetched = sum(max(0, end - max(self.cursors[p], low)) for p, low, end in ends)
        return unfetched + len(self.buffer) + len(self.requeued)

    async def ready_in_store(self) -> int:
        """``_ready_at`` against the store's current ends (a store call)."""
        stats = await self.store.queue_stats(self.queue_id)
        return self._ready_at((s.partition, s.min_offset, s.max_offset) for s in stats.partitions)

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

    def _lost_to_retention(self, count: int) -> None:
        if count <= 0:
            return
        self.dropped_by_retention += count
        self.ready_count = max(0, self.ready_count - count)
        log.warning(
            "queue %r: %d unread message(s) removed by the store's retention (age or disk "
            "budget) before delivery",
            self.name,
            count,
        )

    async def drop_stored_before(self, cut_ts_ms: int, why: str) -> int:
        """Ready messages stored before ``cut_ts_ms`` leave without dead-lettering, as
        retention (x-max-age, disk-overflow drop-oldest); unacked ones stay with their
        consumers. Counted in dropped_by_retention and logged."""
        dropped, bytes_known = await self._drop_held_before(cut_ts_ms)
        skipped = 0
        for p in range(self.partitions):
            target = await self.store.offset_for_time(self.queue_id, p, cut_ts_ms)
            if target > self.cursors[p]:
                skipped += target - self.cursors[p]
                self.cursors[p] = target
        dropped += skipped
        if not dropped:
            return 0
        self.ready_count = max(0, self.ready_count - dropped)
        self.dropped_by_retention += dropped
        self.commit_dirty = True
        if (skipped or not bytes_known) and self.behaviour.max_length_bytes is not None:
            await self.recount_bytes()
        log.warning("queue %r: %d unread message(s) dropped: %s", self.name, dropped, why)
        return dropped

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
        self._gone(partition, message, "rejected")

    def leave(self, partition: int, message: StoredMessage, reason: str) -> None:
        """A ready message leaves from the head: expired, maxlen (drop-head)."""
        self.ready_count -= 1
        self.ready_bytes -= len(message.body)
        self._gone(partition, message, reason)

    def _gone(
        self, partition: int, message: StoredMessage, reason: str, to_dlq: bool = False
    ) -> None:
        """The message left for good: dead-lettered if the queue has somewhere to send it."""
        self.returns.pop((partition, message.queue_offset), None)
        self.commit_dirty = True
        b = self.behaviour
        if b.counts_deliveries:  # the count is stamped per delivery, not part of the message
            message = _stamped(message, None)
        dlx, dlrk = b.dlx, b.dlrk
        if dlx is None and to_dlq:
            dlx, dlrk = "", self.name + DLQ_SUFFIX
        if dlx is None or self.outbox is None:
            self.dropped += 1
            return
        self.dead_lettered += 1
        settled = None
        if b.dead_letter_at_least_once and not to_dlq:
            settled = self._held_until_stored(partition, message.queue_offset)
        self.outbox(
            DeadLetter(
                self.name,
                reason,
                message.exchange.decode(),
                message.routing_key.decode(),
                bytes(message.properties),
                bytes(message.body),
                bool(message.flags & PERSISTENT),
                dlx,
                dlrk,
                to_dlq and b.dlx is None,
                settled,
            )
        )

    def _held_until_stored(self, partition: int, offset: int) -> Callable[[], None]:
        """At-least-once: the message holds the committed offset until its dead letter is
        durable (then the returned callback settles it)."""
        self.inflight[partition].add(offset)

        def settled() -> None:
            self.inflight[partition].discard(offset)
            self.commit_dirty = True

        return settled

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
        self._gone(partition, message, "delivery_limit", to_dlq=True)

    def requeue(self, partition: int, message: StoredMessage) -> None:
        if self.deleted:
            return
        self.inflight[partition].discard(message.queue_offset)
        limit = self.behaviour.delivery_limit
        if limit is not None:
            key = (partition, message.queue_offset)
            returned = self.returns.get(key, 0) + 1
            if returned > limit:
                self._gone(partition, message, "delivery_limit")
                return
            self.returns[key] = returned  # take() stamps it on the next delivery
        self.ready_count += 1
        self.ready_bytes += len(message.body)
        self._return(partition, message)

    def _return(self, partition: int, message: StoredMessage) -> None:
        """Back in the queue, before every newer message (RabbitMQ keeps its place)."""
        heapq.heappush(self.requeued, (message.commit_offset, partition, message))

    async def expire(self, now_ms: int) -> int | None:
        """Drop expired messages from the head; returns the next head's deadline, if any."""
        if self.behaviour.message_ttl_ms is None and not self._head_may_expire():
            return None
        while True:
            head = await self._fetch_head(always=False)
            if head is None:
                return None
            deadline = self.deadline(head)
            if deadline is None or deadline > now_ms:
                return deadline
            taken = self._pop_head()
            assert taken is not None
            self.leave(taken[0], taken[1], "expired")

    def _head_may_expire(self) -> bool:
        head = self._peek_head()
        if head is not None:
            return bool(head.flags & EXPIRATION_FLAG)
        return self.expirations_seen and self.ready_count > 0

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
        if self.behaviour.overflow != "drop-head":
            return
        while self.over_limit():
            if await self._fetch_head(always=True) is None:
                return
            taken = self._pop_head()
            assert taken is not None
            self.leave(taken[0], taken[1], "maxlen")

    def pump(self, quota: int, now: float) -> PumpResult:
        """Deliver up to ``quota`` messages to consumers with credit (and within the rate)."""
        if self.paused or not self.holds_all_leases():
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
        now_ms = wall_ms()
        while delivered < quota:
            if not self.has_buffered():
                return PumpResult.NO_MESSAGES
            consumer = self.next_consumer()
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
        wake_at: float | None = None
        for consumer in self.consumers:
            limits = consumer.sink.limits
            if limits is not None and not limits.ready():
                at = limits.next_at()
                wake_at = at if wake_at is None else min(wake_at, at)
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
            return stats.ready
        if self.behaviour.message_ttl_ms is not None or self.expirations_seen:
            await self.expire(wall_ms())
        if self.leases is None:
            return self.ready_count
        return await self.ready_in_store()

    # -- cluster delivery leases ------------------------------------------------------------

    def holds_all_leases(self) -> bool:
        return self.leases is None or all(self.leases)

    def set_lease(self, partition: int, held: bool) -> None:
        if self.leases is not None:
            self.leases[partition] = held

    async def take_over(self, partition: int) -> None:
        """This gateway now delivers ``partition``: start from the broker's committed offset
        (another gateway may have delivered and committed meanwhile) and flag what lies
        before the end as possibly delivered already (it may have gone out from there).
        The read registers the lease's fencing token (``fences``, set by the cluster link):
        the holder replaced can commit no more (StaleFence)."""
        stats = await self.store.queue_stats(self.queue_id)
        committed = await self.store.committed_offset(
            QUEUE_GROUP, self.queue_id, partition, self.fences[partition]
        )
        # Dropped after the reads (which yield): the partition is read again from committed.
        self.buffer = deque(item for item in self.buffer if item[0] != partition)
        requeued = [item for item in self.requeued if item[1] != partition]
        heapq.heapify(requeued)
        self.requeued = requeued
        part = stats.partitions[partition]
        self.cursors[partition] = max(committed, part.min_offset)
        self.maybe_delivered[partition] = part.max_offset
        self.ready_count = (
            sum(max(0, s.max_offset - self.cursors[s.partition]) for s in stats.partitions)
            + sum(1 for _ in self.buffer)
            + len(self.requeued)
        )
        self.exhausted = False
        self.set_lease(partition, True)

    async def reset_to_time(self, ts_ms: int) -> list[tuple[int, int]]:
        """RocketMQ's resetOffsetByTime: each partition is read again from its first message
        stored at or after ``ts_ms`` (what lies before is skipped, what was consumed after
        is replayed). Returns (from, to) offsets per partition. What consumers hold unacked
        stays with them (and may come again if the reset replays it)."""
        moves = []
        before = self.committed_offsets()
        for p in range(self.partitions):
            target = await self.store.offset_for_time(self.queue_id, p, ts_ms)
            moves.append((before[p], target))
        self.buffer.clear()
        self.requeued.clear()
        self.returns.clear()
        self.cursors = [to for _, to in moves]
        stats = await self.store.queue_stats(self.queue_id)
        self.ready_count = sum(
            max(0, s.max_offset - self.cursors[s.partition]) for s in stats.partitions
        )
        self.exhausted = False
        self.commit_dirty = True
        if self.behaviour.max_length_bytes is not None:
            await self.recount_bytes()
        await self.commit()
        return moves

    async def purge(self) -> int:
        count = self.ready_count
        purged = await self.store.purge(self.queue_id)
        if not self.holds_all_leases():  # cluster: another gateway delivers; the broker knows
            count = purged
        self.buffer.clear()
        self.requeued.clear()
        stats = await self.store.queue_stats(self.queue_id)
        self.cursors = [s.max_offset for s in stats.partitions]
        self.ready_count = self.ready_bytes = 0
        self.dropped += count
        self.commit_dirty = True
        return count

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

    async def commit(self) -> None:
        if not self.commit_dirty or self.deleted:
            return
        self.commit_dirty = False
        for partition, offset in enumerate(self.committed_offsets()):
            fence = self.fences[partition]
            try:
                await self.store.commit_offset(QUEUE_GROUP, self.queue_id, partition, offset, fence)
            except StaleFence as error:
                self.lose_lease(partition, error)

    def lose_lease(self, partition: int, error: StaleFence) -> None:
        """The broker refused our fencing token: another gateway took the partition over
        (our lease lapsed while we were paused or cut off from Redis). Stop delivering it;
        what our consumers hold unacked is redelivered from there."""
        if self.fences[partition] == 0:
            return
        log.warning(
            "queue %r partition %d: offset commit refused (%s); lease token %d replaced, "
            "no longer delivering this partition",
            self.name,
            partition,
            error,
            self.fences[partition],
        )
        self.fences[partition] = 0
        self.set_lease(partition, False)


def with_delivery_count(properties: bytes | memoryview, count: int | None) -> bytes:
    """The properties with x-delivery-count set to ``count`` (None: removed)."""
    raw = None if count is None else pb.long(count)
    return pb.set_header(properties, DELIVERY_COUNT, "l", raw)


def _stamped(message: StoredMessage, count: int | None) -> StoredMessage:
    """Quorum-queue style: each delivery carries x-delivery-count, the times it came back.
    Properties the broker cannot edit go out as they came in."""
    try:
        properties = with_delivery_count(message.properties, count)
    except pb.PropertyError:
        return message
    return message._replace(properties=memoryview(properties))
