"""A partitioned FIFO queue whose first ⌈K/2⌉ and last ⌊K/2⌋ partitions carry gray traffic
(gray release, docs/gray.md; K is the queue's ``gray-partitions``).

The queue keeps its one consumer group and its one set of offsets; what changes is who reads
what. Gray consumers read the gray partitions, normal consumers the others, and a consumer
with gray handling switched off reads both. So the queue holds two lanes: the normal lane is
the runtime's own ``buffer`` and ``requeued`` heap, the gray lane a second pair, each with its
own round-robin consumer choice. A lane whose consumers are busy or absent never holds up the
other: each is read from the store only while its own buffer runs low, so the messages of a
lane nobody takes wait in the store, counted and visible.

With K = 0 every method here hands over to the plain runtime: a multi-partition queue without
gray partitions behaves, and costs, as before (one-partition queues never use this class).
K may change while the queue runs (a policy, ``mqgw ctl gray end``): the held messages move
to their new lane, in commit-offset order.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from gateway.queues.behaviour import QueueBehaviour
from gateway.queues.clock import SYSTEM_CLOCK, Clock
from gateway.queues.consumer import LANE_ALL, LANE_GRAY, LANE_NORMAL
from gateway.queues.consumer_choice import ConsumerChoice
from gateway.queues.dead_letter import DeadLetter
from gateway.queues.rate_limit import TokenBucket
from gateway.queues.runtime import PumpResult, QueueRuntime
from gateway.queues.store_reads import FETCH_BATCH, LOW_WATER
from meta.models import QueueDef
from storage import DeliveryProgress, StoredMessage, StorePort

if TYPE_CHECKING:
    from gateway.queues.consumer import QueueConsumer

Held = tuple[int, StoredMessage]  # (partition, message)
Returned = tuple[int, int, StoredMessage]  # (commit offset, partition, message)


def gray_partitions(partitions: int, k: int) -> tuple[int, ...]:
    """The first ⌈K/2⌉ and the last ⌊K/2⌋ partitions (the seed's layout); () for K = 0."""
    if k <= 0 or k >= partitions:
        return ()
    first = (k + 1) // 2
    return tuple(range(first)) + tuple(range(partitions - k // 2, partitions))


class GrayLanesRuntime(QueueRuntime):
    """A queue runtime whose gray partitions are delivered to gray consumers only."""

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
        super().__init__(definition, store, behaviour, outbox, wake, choice, clock)
        self.gray_buffer: deque[Held] = deque()
        self.gray_requeued: list[Returned] = []
        self.gray_choice = ConsumerChoice()
        self.normal_choice = ConsumerChoice()
        self._gray_set: frozenset[int] = frozenset()
        self._unread_lane = False  # a fill left a full lane unread: read it once it drains
        self._first_lane = LANE_GRAY  # the lane served first, alternating by turn
        self._set_lanes(self.behaviour.gray_partitions)

    # -- lanes ------------------------------------------------------------------------------

    def set_behaviour(self, behaviour: QueueBehaviour) -> None:
        super().set_behaviour(behaviour)
        if gray_partitions(self.partitions, behaviour.gray_partitions) != self.gray_parts:
            self._set_lanes(behaviour.gray_partitions)
            if self.wake is not None:
                self.wake(self)

    def _set_lanes(self, k: int) -> None:
        """Gray partitions from K; what is held moves to its lane, in commit order."""
        self.gray_parts = gray_partitions(self.partitions, k)
        self._gray_set = frozenset(self.gray_parts)
        self.normal_parts = tuple(p for p in range(self.partitions) if p not in self._gray_set)
        held = heapq.merge(self.buffer, self.gray_buffer, key=lambda pm: pm[1].commit_offset)
        self.buffer, self.gray_buffer = deque(), deque()
        for item in list(held):
            (self.gray_buffer if item[0] in self._gray_set else self.buffer).append(item)
        returned = self.requeued + self.gray_requeued
        self.requeued = [r for r in returned if r[1] not in self._gray_set]
        self.gray_requeued = [r for r in returned if r[1] in self._gray_set]
        heapq.heapify(self.requeued)
        heapq.heapify(self.gray_requeued)
        self._sort_lanes()

    def is_gray(self, partition: int) -> bool:
        return partition in self._gray_set

    # -- cluster: a gateway may deliver one lane while another delivers the other ------------

    def _holds(self, parts: tuple[int, ...]) -> bool:
        leases = self.leases
        return leases is None or all(leases[p] for p in parts)

    def may_serve(self) -> bool:
        if not self.gray_parts or self.leases is None:
            return super().may_serve()
        return self._holds(self.gray_parts) or self._holds(self.normal_parts)

    def spreads_delivery(self) -> bool:
        b = self.behaviour
        arguments = self.definition.arguments
        return (
            not self.gray_parts
            and type(self.choice) is ConsumerChoice
            and arguments.get("x-queue-type", "classic") == "classic"
            and arguments.get("x-consume-mode") != "broadcast"
            and not b.has_limits
            and not b.counts_deliveries
        )

    def wants_partition(self, partition: int) -> bool:
        if not self.gray_parts:
            return super().wants_partition(partition)
        lane = self.gray_choice if partition in self._gray_set else self.normal_choice
        return bool(lane.consumers)

    def consumers_changed(self) -> None:
        """Sort the consumers into the lanes again: a connection's gray state changed."""
        self._sort_lanes()
        if self.wake is not None:
            self.wake(self)

    def _sort_lanes(self) -> None:
        if not self.gray_parts:  # no lanes: the plain runtime's choice serves everyone
            self.gray_choice.consumers.clear()
            self.normal_choice.consumers.clear()
            return
        self.gray_choice.consumers[:] = [c for c in self.consumers if c.lane != LANE_NORMAL]
        self.normal_choice.consumers[:] = [c for c in self.consumers if c.lane != LANE_GRAY]

    def add_consumer(self, consumer: QueueConsumer) -> None:
        super().add_consumer(consumer)
        self._sort_lanes()

    def remove_consumer(self, consumer: QueueConsumer) -> None:
        super().remove_consumer(consumer)
        self._sort_lanes()

    # -- the heads --------------------------------------------------------------------------

    def has_buffered(self) -> bool:
        return bool(self.requeued or self.buffer or self.gray_requeued or self.gray_buffer)

    def lane_buffered(self, lane: int) -> bool:
        if lane == LANE_GRAY:
            return bool(self.gray_requeued or self.gray_buffer)
        return bool(self.requeued or self.buffer)

    def _pop_head(self, lane: int = LANE_ALL) -> tuple[int, StoredMessage, bool] | None:
        if not self.gray_parts:
            return super()._pop_head()
        if lane == LANE_ALL:
            lane = self._older_lane()
        if lane == LANE_GRAY:
            if self.gray_requeued:
                _, partition, message = heapq.heappop(self.gray_requeued)
                return partition, message, True
            if self.gray_buffer:
                partition, message = self.gray_buffer.popleft()
                self._lane_drained(self.gray_buffer)
                return partition, message, False
            return None
        taken = super()._pop_head()
        self._lane_drained(self.buffer)
        return taken

    def _peek_head(self) -> StoredMessage | None:
        if self.gray_parts and self._older_lane() == LANE_GRAY:
            if self.gray_requeued:
                return self.gray_requeued[0][2]
            return self.gray_buffer[0][1] if self.gray_buffer else None
        return super()._peek_head()

    def _lane_buffer(self, lane: int) -> deque[Held]:
        return self.gray_buffer if lane == LANE_GRAY else self.buffer

    def _older_lane(self) -> int:
        """The lane whose head came first (requeued before read, then commit offset)."""
        gray = _head_key(self.gray_requeued, self.gray_buffer)
        normal = _head_key(self.requeued, self.buffer)
        if gray is None:
            return LANE_NORMAL
        return LANE_GRAY if normal is None or gray < normal else LANE_NORMAL

    def _lane_drained(self, buffer: deque[Held]) -> None:
        if self._unread_lane and len(buffer) < LOW_WATER:
            self._unread_lane = False
            self.exhausted = False  # the lane left unread at the last fill: read it now

    def _return(self, partition: int, message: StoredMessage) -> None:
        if partition in self._gray_set:
            heapq.heappush(self.gray_requeued, (message.commit_offset, partition, message))
        else:
            super()._return(partition, message)

    # -- reading ----------------------------------------------------------------------------

    async def fill(self) -> None:
        """Each lane is read while its own buffer runs low, and only then (in a cluster,
        only a lane whose partitions' leases this gateway holds)."""
        if not self.gray_parts:
            await super().fill()
            return
        lanes: list[tuple[int, tuple[int, ...]]] = []
        full = False  # a lane left unread because its buffer is full
        for lane, parts in ((LANE_GRAY, self.gray_parts), (LANE_NORMAL, self.normal_parts)):
            if not self._holds(parts):
                continue
            if len(self._lane_buffer(lane)) >= LOW_WATER:
                full = True
                continue
            lanes.append((lane, parts))
        self._unread_lane = full
        if not lanes:
            return
        if self.fed:
            self.fed = False
            if self.exhausted:
                return
        self.exhausted = False
        all_ends: list[tuple[int, int, int]] = []
        more = False
        for lane, parts in lanes:
            read, ends, more_here = await self._read_partitions(parts)
            # The lane's buffer as it is now: a hand-over during the read replaced it.
            self._lane_buffer(lane).extend(read)
            all_ends += ends
            more = more or more_here
        if self.leases is not None and len(lanes) < 2:
            # Cluster: the count needs every partition's end; a fill of both lanes has them.
            saved = self.ready_count
            self._filled(all_ends, more)
            self.ready_count = saved
            return
        self._filled(all_ends, more)

    def absorb(self, messages: list[Held]) -> bool:
        if not self.gray_parts:
            return super().absorb(messages)
        gray = [m for m in messages if m[0] in self._gray_set]
        normal = [m for m in messages if m[0] not in self._gray_set]
        if len(self.gray_buffer) + len(gray) > FETCH_BATCH:
            return False
        if len(self.buffer) + len(normal) > FETCH_BATCH:
            return False
        self.gray_buffer.extend(gray)
        self.buffer.extend(normal)
        for partition, _ in messages:
            self.cursors[partition] += 1
        self.fed = True
        return True

    # -- delivering -------------------------------------------------------------------------

    def _pump(self, quota: int, byte_limit: TokenBucket | None, now: float) -> PumpResult:
        if not self.gray_parts:
            return super()._pump(quota, byte_limit, now)
        now_ms = self.clock.wall_ms()
        first = self._first_lane
        self._first_lane = LANE_NORMAL if first == LANE_GRAY else LANE_GRAY
        delivered = 0
        starved: list[ConsumerChoice] = []  # lanes with messages and no consumer to take them
        empty = False
        for lane in (first, self._first_lane):
            if lane == LANE_GRAY:
                choice, parts = self.gray_choice, self.gray_parts
            else:
                choice, parts = self.normal_choice, self.normal_parts
            if not self._holds(parts):
                continue  # cluster: another gateway delivers this lane
            while delivered < quota:
                if not self.lane_buffered(lane):
                    empty = True
                    break
                consumer = choice.next_consumer()
                if consumer is None:
                    starved.append(choice)
                    break
                taken = self.take(now_ms, lane)
                if taken is None:
                    empty = True
                    break
                partition, message, redelivered = taken
                consumer.sink.deliver(consumer, self, partition, message, redelivered)
                delivered += 1
                self.delivered += 1
                if byte_limit is not None:
                    byte_limit.take(len(message.body), now)
                    if byte_limit.available(now) < 1:
                        self.rate_wake_at = byte_limit.next_token_at(now)
                        return PumpResult.RATE_LIMITED
        if delivered >= quota:
            return PumpResult.QUOTA_USED
        if empty:
            return PumpResult.NO_MESSAGES
        return self._lanes_waiting(starved)

    def _lanes_waiting(self, starved: list[ConsumerChoice]) -> PumpResult:
        """As ``_no_consumer_ready``, over the lanes whose consumers cannot take more."""
        wake_at: float | None = None
        for choice in starved:
            at = choice.rate_wake_at()
            if at is not None:
                wake_at = at if wake_at is None else min(wake_at, at)
        if wake_at is None:
            return PumpResult.NO_CREDIT
        self.rate_wake_at = wake_at
        return PumpResult.RATE_LIMITED

    def congested(self) -> bool:
        """Publishers wait only on the lane they write to falling behind; both are counted
        together here, so a lane nobody consumes must not hold the other's publishers."""
        if self.gray_parts and not (self.gray_choice.consumers and self.normal_choice.consumers):
            return False
        return super().congested()

    # -- what is held -----------------------------------------------------------------------

    def held(self) -> Iterator[Held]:
        yield from super().held()
        yield from self.gray_buffer
        for _, partition, message in self.gray_requeued:
            yield partition, message

    def held_count(self) -> int:
        return super().held_count() + len(self.gray_buffer) + len(self.gray_requeued)

    async def _held_bytes(self) -> int:
        return sum(len(m.body) for _, m in self.held())

    def committed_offsets(self) -> list[int]:
        lowest = super().committed_offsets()
        for partition, message in self.gray_buffer:
            lowest[partition] = min(lowest[partition], message.queue_offset)
        for _, partition, message in self.gray_requeued:
            lowest[partition] = min(lowest[partition], message.queue_offset)
        return lowest

    def delivery_progress(self) -> list[DeliveryProgress] | None:
        progress = super().delivery_progress()
        if progress is None or not self.gray_parts:
            return progress
        behind = [p.ready_behind for p in progress]
        for partition, _ in self.gray_buffer:
            behind[partition] += 1
        for _, partition, _ in self.gray_requeued:
            behind[partition] += 1
        return [p._replace(ready_behind=b) for p, b in zip(progress, behind, strict=True)]

    def _forget_partition(self, partition: int) -> None:
        super()._forget_partition(partition)
        self.gray_buffer = deque(item for item in self.gray_buffer if item[0] != partition)
        requeued = [item for item in self.gray_requeued if item[1] != partition]
        heapq.heapify(requeued)
        self.gray_requeued = requeued

    async def _drop_held_before(self, cut_ts_ms: int) -> tuple[int, bool]:
        self._merge_lanes()
        try:
            return await super()._drop_held_before(cut_ts_ms)
        finally:
            self._set_lanes(self.behaviour.gray_partitions)

    def _merge_lanes(self) -> None:
        """Everything held into the normal lane (for the bulk moves written for one lane)."""
        self.buffer = deque(
            heapq.merge(self.buffer, self.gray_buffer, key=lambda pm: pm[1].commit_offset)
        )
        self.gray_buffer = deque()
        self.requeued += self.gray_requeued
        heapq.heapify(self.requeued)
        self.gray_requeued = []

    def clear_held(self) -> None:
        super().clear_held()
        self.gray_buffer.clear()
        self.gray_requeued.clear()


def _head_key(requeued: list[Returned], buffer: deque[Held]) -> tuple[int, int] | None:
    """Order of a lane's head: requeued first (0), then by commit offset."""
    if requeued:
        return (0, requeued[0][0])
    if buffer:
        return (1, buffer[0][1].commit_offset)
    return None
