"""A queue's live state on this gateway: where each partition is read, what is buffered,
what is in flight, who consumes. Messages themselves stay in the log store.

Order: within a broker the commitlog offset is a total arrival order, so partitions are merged
by commit offset and deliveries follow publish order exactly, as RabbitMQ's would. Requeued
messages (nack/reject with requeue, or unacked at channel close) go to a heap ordered by commit
offset and are delivered before anything newer, flagged redelivered.
Committed offset per partition = the lowest offset not yet settled (at-least-once).
"""

from __future__ import annotations

import heapq
from collections import deque
from enum import Enum
from typing import TYPE_CHECKING

from gateway.rate_limit import TokenBucket
from meta.models import QueueDef
from storage import QUEUE_GROUP, EmbeddedStore, StoredMessage

if TYPE_CHECKING:
    from gateway.channel_state import Consumer

FETCH_BATCH = 256
LOW_WATER = 64


class PumpResult(Enum):
    QUOTA_USED = 1  # more may be deliverable: serve again next turn
    NO_CREDIT = 2  # messages wait for a consumer with credit (an ack/consume wakes us)
    NO_MESSAGES = 3  # buffer empty (a fetch or a publish wakes us)
    PAUSED = 4  # consumption paused by an operator (resume wakes us)
    RATE_LIMITED = 5  # out of tokens (the scheduler's timer wakes us when one is back)


class QueueRuntime:
    def __init__(self, definition: QueueDef, store: EmbeddedStore) -> None:
        self.definition = definition
        self.name = definition.name
        self.queue_id = definition.queue_id
        self.partitions = definition.partitions
        self.store = store
        self.consumers: list[Consumer] = []
        self._rr = 0
        self.cursors = [0] * self.partitions  # next offset to fetch, per partition
        self.buffer: deque[tuple[int, StoredMessage]] = deque()
        self.requeued: list[tuple[int, int, StoredMessage]] = []  # (commit offset, partition, m)
        self.inflight: list[set[int]] = [set() for _ in range(self.partitions)]
        self.exhausted = False  # last fetch found nothing new
        self.scheduled = False  # in the push scheduler's ready set or being served
        self.rewake = False
        self.deleted = False
        self.commit_dirty = False
        self.paused = False
        self.rate_limit: TokenBucket | None = None
        self.delivered = 0  # total deliveries (consumers and basic.get), for stats and tests

    async def start(self) -> None:
        """Resume from the committed offsets: what was in flight at a stop is redelivered."""
        for p in range(self.partitions):
            self.cursors[p] = await self.store.committed_offset(QUEUE_GROUP, self.queue_id, p)

    # -- consumers ------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)

    @property
    def has_exclusive_consumer(self) -> bool:
        return any(c.exclusive for c in self.consumers)

    def next_consumer(self) -> Consumer | None:
        """Round-robin among the highest-priority consumers that have credit."""
        consumers = self.consumers
        n = len(consumers)
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

    # -- messages -------------------------------------------------------------------------

    def has_buffered(self) -> bool:
        return bool(self.requeued or self.buffer)

    @property
    def may_deliver(self) -> bool:
        """Messages buffered or still in the store: worth a turn when credit comes back."""
        return self.has_buffered() or not self.exhausted

    def take(self) -> tuple[int, StoredMessage, bool] | None:
        """Next message to hand out: (partition, message, redelivered)."""
        if self.requeued:
            _, partition, message = heapq.heappop(self.requeued)
            self.inflight[partition].add(message.queue_offset)
            return partition, message, True
        if self.buffer:
            partition, message = self.buffer.popleft()
            self.inflight[partition].add(message.queue_offset)
            return partition, message, False
        return None

    async def fill(self) -> None:
        """Fetch from the store when the buffer runs low (batched; merged by commit offset)."""
        if len(self.buffer) >= LOW_WATER:
            return
        fetched: list[list[tuple[int, StoredMessage]]] = []
        more = False
        for p in range(self.partitions):
            result = await self.store.read(self.queue_id, p, self.cursors[p], FETCH_BATCH)
            self.cursors[p] = result.next_offset
            more = more or result.next_offset < result.max_offset
            if result.messages:
                fetched.append([(p, m) for m in result.messages])
        # Reached the end of every partition: nothing to fetch until a publish wakes us
        # (saves an empty turn per message when thousands of queues each get a trickle).
        self.exhausted = not more
        if not fetched:
            return
        if len(fetched) == 1:
            self.buffer.extend(fetched[0])
        else:
            self.buffer.extend(heapq.merge(*fetched, key=lambda pm: pm[1].commit_offset))

    def settle(self, partition: int, message: StoredMessage) -> None:
        """Ack, reject without requeue, or a no-ack delivery: the message is done."""
        self.inflight[partition].discard(message.queue_offset)
        self.commit_dirty = True

    def requeue(self, partition: int, message: StoredMessage) -> None:
        if self.deleted:
            return
        self.inflight[partition].discard(message.queue_offset)
        heapq.heappush(self.requeued, (message.commit_offset, partition, message))

    def pump(self, quota: int, now: float) -> PumpResult:
        """Deliver up to ``quota`` messages to consumers with credit (and within the rate)."""
        if self.paused:
            return PumpResult.PAUSED
        limit = self.rate_limit
        if limit is not None:
            quota = min(quota, limit.available(now))
            if quota <= 0:
                return PumpResult.RATE_LIMITED
        before = self.delivered
        result = self._pump(quota)
        if limit is not None:
            limit.take(self.delivered - before, now)
        return result

    def _pump(self, quota: int) -> PumpResult:
        delivered = 0
        while delivered < quota:
            if not self.has_buffered():
                return PumpResult.NO_MESSAGES
            consumer = self.next_consumer()
            if consumer is None:
                return PumpResult.NO_CREDIT
            taken = self.take()
            assert taken is not None
            partition, message, redelivered = taken
            consumer.channel.session.deliver(consumer, self, partition, message, redelivered)
            delivered += 1
            self.delivered += 1
        return PumpResult.QUOTA_USED

    # -- counts and offsets ---------------------------------------------------------------

    async def message_count(self) -> int:
        """Ready messages: buffered, requeued and not yet fetched (unacked excluded)."""
        stats = await self.store.queue_stats(self.queue_id)
        unfetched = sum(
            max(0, s.max_offset - max(self.cursors[s.partition], s.min_offset))
            for s in stats.partitions
        )
        return unfetched + len(self.buffer) + len(self.requeued)

    async def purge(self) -> int:
        count = await self.message_count()
        await self.store.purge(self.queue_id)
        self.buffer.clear()
        self.requeued.clear()
        stats = await self.store.queue_stats(self.queue_id)
        self.cursors = [s.max_offset for s in stats.partitions]
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
            await self.store.commit_offset(QUEUE_GROUP, self.queue_id, partition, offset)
