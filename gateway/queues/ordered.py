"""A keyed-order queue (``x-mqgw-ordering: key``, docs/ordering.md): strict per-key order
across its partitions and across every rescale, after QMQ's ordered messages and RocketMQ's
orderly consumption.

- **Publishing.** A message's partition is its key's, in the newest version of the queue's
  route (meta/queue_route.py): ``crc32(key) % L`` looked up in the route's ranges
  (``key_partition``), not the channel's sticky one.
- **One consumer per partition.** Each readable partition is held by one consumer of the
  queue at a time (gateway/queues/partition_holders.py) and delivered to it alone, in offset
  order; a requeued message comes back before anything later of its partition.
- **The version gate.** A partition opened by a change delivers only once the partitions it
  replaced are removed (drained up to their command record): the messages of a key published
  before the change all come first. A command record read from a closed partition is never
  delivered (``COMMAND_EXCHANGE``).

The held messages are kept per partition: ``pending`` (read, in offset order) and ``back``
(requeued, a heap by offset); the plain runtime's ``buffer`` and ``requeued`` stay empty.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from gateway.queues.behaviour import QueueBehaviour
from gateway.queues.clock import SYSTEM_CLOCK, Clock
from gateway.queues.consumer import LANE_ALL
from gateway.queues.consumer_choice import ConsumerChoice
from gateway.queues.dead_letter import DeadLetter
from gateway.queues.partition_holders import PartitionHolders
from gateway.queues.rate_limit import TokenBucket
from gateway.queues.runtime import PumpResult, QueueRuntime
from gateway.queues.store_reads import COMMAND, FETCH_BATCH, LOW_WATER
from meta.models import QueueDef
from meta.queue_route import QueueRoute, gate_open, logical_of
from storage import DeliveryProgress, StoredMessage, StorePort

if TYPE_CHECKING:
    from gateway.queues.consumer import QueueConsumer as Consumer

# Publish flow control (QueueRuntime's FLOW_HIGH/FLOW_LOW, a quarter): a partition goes to one
# consumer, so a backlog drains no faster than its holder; 2,000 behind made keyed-1p's p99
# 15x RabbitMQ's single active consumer, 500 brings it level (mqgw bench run keyed-1p).
KEYED_FLOW_HIGH = 500
KEYED_FLOW_LOW = 125
ANY = -1  # _pop_head from the partition with the oldest head
UNHELD = -2  # ... among the partitions no consumer holds (basic.get)


class OrderedRuntime(QueueRuntime):
    keyed = True
    route: QueueRoute  # always: it runs on it

    def __init__(
        self,
        definition: QueueDef,
        store: StorePort,
        behaviour: QueueBehaviour | None = None,
        outbox: Callable[[DeadLetter], None] | None = None,
        wake: Callable[[QueueRuntime], None] | None = None,
        choice: ConsumerChoice | None = None,
        clock: Clock = SYSTEM_CLOCK,
        route: QueueRoute | None = None,
    ) -> None:
        super().__init__(definition, store, behaviour, outbox, wake, choice, clock)
        assert route is not None, "an ordered queue runs on its route"
        self.pending: list[deque[StoredMessage]] = []
        self.back: list[list[tuple[int, StoredMessage]]] = []
        self.unread: list[bool] = []  # its last read stopped before the store's end
        self.held_total = 0
        self.holders = PartitionHolders()
        self.readable: list[int] = []
        self._from = ANY
        self._rr = 0
        self.route = route
        self._table: list[int] = []
        self.header: str | None = None
        self._grow(len(route.partitions))
        self.set_route(route)

    def _holds_of(self, partition: int) -> bool:
        return bool(self.pending[partition] or self.back[partition])

    def start_leasing(self) -> None:
        super().start_leasing()
        self._set_readable()

    def set_lease(self, partition: int, held: bool) -> None:
        super().set_lease(partition, held)
        self._set_readable()
        # Not exhausted any more, and perhaps other holders: a turn must come, or nothing
        # wakes the queue (the long-poll watchers act only on an exhausted queue).
        self._wake()

    def holds_all_leases(self) -> bool:
        """Cluster: the leases of every partition that may still deliver (a removed one's
        lease is given up)."""
        if self.leases is None:
            return True
        parts = self.route.partitions
        return all(held or p >= len(parts) or parts[p].state == "removed"
                   for p, held in enumerate(self.leases))  # fmt: skip

    def may_serve(self) -> bool:
        """Cluster: one partition's lease is enough (each is delivered on its own)."""
        return self.leases is None or any(self.leases)

    def wants_partition(self, partition: int) -> bool:
        """Cluster: worth holding while it may still deliver and a consumer is here."""
        if partition >= len(self.route.partitions):
            return False  # the store grew; the route that says so is not here yet
        if partition in self.behind_removed:
            return True
        part = self.route.partitions[partition]
        return bool(self.consumers) and part.state != "removed" and gate_open(self.route, partition)

    def _wake(self) -> None:
        if self.started and self.wake is not None:
            self.wake(self)

    # -- the route --------------------------------------------------------------------------

    def set_route(self, route: QueueRoute) -> None:
        """A new version, or a partition's state changed: publishers and readers follow."""
        self.route = route
        self.header = route.header
        table = [0] * route.logical
        for r in route.ranges:
            table[r.start : r.end] = [r.partition] * (r.end - r.start)
        self._table = table
        self._grow(len(route.partitions))
        if self.started:
            self.pass_removed_records()
        self._set_readable()
        self._wake()

    def _set_readable(self) -> None:
        route = self.route
        self.readable = [
            p.partition
            for p in route.partitions
            if p.state != "removed"
            and gate_open(route, p.partition)
            and self.holds_lease(p.partition)
        ]
        self.holders.stale = True
        self.exhausted = False

    def _grow(self, partitions: int) -> None:
        """The store queue gained partitions (a change opened them): every per-partition list
        reaches the count; a new partition is read from its start."""
        extra = partitions - len(self.pending)
        if extra <= 0:
            return
        self.pending.extend(deque() for _ in range(extra))
        self.back.extend([] for _ in range(extra))
        self.unread.extend([False] * extra)
        self.grow_partitions(partitions)
        self.normal_parts = tuple(range(partitions))

    def key_partition(self, routing_key: str, headers: Mapping[str, Any] | None) -> int:
        """The partition a message goes to: its key's, in the newest version."""
        if self.header is None:
            key = routing_key.encode()
        else:
            value = None if headers is None else headers.get(self.header)
            if isinstance(value, bytes):
                key = value
            else:  # no header: the empty key (one order for all such messages)
                key = b"" if value is None else str(value).encode()
        return self._table[logical_of(key, len(self._table))]

    def command_appended(self, partition: int) -> None:
        """A change appended its command record to ``partition`` (counted already): read up
        to it."""
        self.unread[partition] = True
        self.exhausted = False
        self._wake()

    # -- consumers ----------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        super().add_consumer(consumer)
        self.holders.stale = True

    def remove_consumer(self, consumer: Consumer) -> None:
        super().remove_consumer(consumer)
        self.holders.stale = True
        if self.wake is not None:
            self.wake(self)

    def holder(self, partition: int) -> Consumer | None:
        """The consumer holding ``partition`` now (gateway/queues/partition_holders.py)."""
        return self.holders.holder(partition, self.consumers)

    def _assign(self) -> None:
        self.holders.assign(self.consumers, self.readable, self.inflight)

    # -- publish flow control ---------------------------------------------------------------

    def _consuming(self) -> bool:
        """A holder is taking messages or will ack some: its credit comes back."""
        return self.holders.consuming(self.inflight)

    def congested(self) -> bool:
        """Far behind its holders: publishers wait (idle consumers that hold no partition
        would never take these messages, so they do not count)."""
        return self.ready_count > KEYED_FLOW_HIGH and self._consuming()

    def release_publishers(self) -> None:
        """Only once caught up, or when no holder is consuming: a holder out of credit gets
        it back at its next ack (the wait is bounded by the session all the same)."""
        if self.ready_count > KEYED_FLOW_LOW and self._consuming() and not self.deleted:
            return
        super().release_publishers()

    # -- held messages ----------------------------------------------------------------------

    def has_buffered(self) -> bool:
        return self.held_total > 0

    def _head_partition(self) -> int | None:
        """The partition whose head is oldest (of those ``_from`` allows)."""
        if self._from >= 0:
            return self._from
        best: int | None = None
        best_at = 0
        for p in range(len(self.pending)):
            if self._from == UNHELD and self.holders.held(p):
                continue
            head = self._head_of(p)
            if head is not None and (best is None or head.commit_offset < best_at):
                best, best_at = p, head.commit_offset
        return best

    def _head_of(self, partition: int) -> StoredMessage | None:
        back = self.back[partition]
        if back:
            return back[0][1]
        pending = self.pending[partition]
        return pending[0] if pending else None

    def _pop_head(self, lane: int = LANE_ALL) -> tuple[int, StoredMessage, bool] | None:
        p = self._head_partition()
        if p is None:
            return None
        if self.back[p]:
            self.held_total -= 1
            return p, heapq.heappop(self.back[p])[1], True
        if self.pending[p]:
            self.held_total -= 1
            return p, self.pending[p].popleft(), False
        return None

    def _peek_head(self) -> StoredMessage | None:
        p = self._head_partition()
        return None if p is None else self._head_of(p)

    def _return(self, partition: int, message: StoredMessage) -> None:
        """Back before everything later of its partition."""
        heapq.heappush(self.back[partition], (message.queue_offset, message))
        self.held_total += 1
        self.holders.settled(partition, self.inflight)

    def settle(self, partition: int, message: StoredMessage) -> None:
        super().settle(partition, message)
        self.holders.settled(partition, self.inflight)

    def reject(self, partition: int, message: StoredMessage) -> None:
        super().reject(partition, message)
        self.holders.settled(partition, self.inflight)

    def held_count(self) -> int:
        return self.held_total

    def held(self) -> Iterator[tuple[int, StoredMessage]]:
        for p, pending in enumerate(self.pending):
            for message in pending:
                yield p, message
        for p, back in enumerate(self.back):
            for _, message in back:
                yield p, message

    def clear_held(self) -> None:
        for pending in self.pending:
            pending.clear()
        for back in self.back:
            back.clear()
        self.held_total = 0

    async def _held_bytes(self) -> int:
        return sum(len(m.body) for _, m in self.held())

    async def _drop_held_before(self, cut_ts_ms: int) -> tuple[int, bool]:
        dropped = 0
        for p in range(len(self.pending)):
            kept = deque(m for m in self.pending[p] if m.store_ts_ms >= cut_ts_ms)
            back = [item for item in self.back[p] if item[1].store_ts_ms >= cut_ts_ms]
            for m in [*self.pending[p], *(m for _, m in self.back[p])]:
                if m.store_ts_ms < cut_ts_ms:
                    dropped += 1
                    self.ready_bytes -= len(m.body)
                    self.returns.pop((p, m.queue_offset), None)
            heapq.heapify(back)
            self.pending[p], self.back[p] = kept, back
        self.held_total -= dropped
        return dropped, True

    def _forget_partition(self, partition: int) -> None:
        self.held_total -= len(self.pending[partition]) + len(self.back[partition])
        self.pending[partition].clear()
        self.back[partition].clear()

    def committed_offsets(self) -> list[int]:
        lowest = list(self.cursors)
        for p in range(len(self.pending)):
            if self.pending[p]:
                lowest[p] = min(lowest[p], self.pending[p][0].queue_offset)
            if self.back[p]:
                lowest[p] = min(lowest[p], self.back[p][0][0])
            if self.inflight[p]:
                lowest[p] = min(lowest[p], *self.inflight[p])
        return lowest

    def delivery_progress(self) -> list[DeliveryProgress] | None:
        if self.leases is None:
            return None
        takers = sum(1 for c in self.consumers if c.has_credit())
        return [
            DeliveryProgress(at, len(self.pending[p]) + len(self.back[p]), takers)
            for p, at in enumerate(self.cursors)
        ]

    # -- reading ------------------------------------------------------------------------------

    async def fill(self) -> None:
        """Read each readable partition whose held messages run low, from its cursor."""
        if self.fed:
            self.fed = False
            if self.exhausted:
                return
        self.exhausted = False
        low = [p for p in self.readable if len(self.pending[p]) < LOW_WATER]
        read, ends, more = await self._read_partitions(low)
        for p, _min, end in ends:
            self.unread[p] = self.cursors[p] < end
        more = more or any(self.unread[p] for p in self.readable)
        for p, message in read:
            if message.exchange == COMMAND:  # a change's command record: never delivered
                self.ready_count -= 1
                self.commit_dirty = True
                continue
            self.pending[p].append(message)
            self.held_total += 1
        self._filled(ends, more)

    def caught_up(self, starts: Mapping[tuple[int, int], int]) -> bool:
        if self.held_total >= LOW_WATER:
            return False
        return super().caught_up(starts)

    def absorb(self, messages: list[tuple[int, StoredMessage]]) -> bool:
        if self.held_total + len(messages) > FETCH_BATCH:
            return False
        for partition, message in messages:
            self.pending[partition].append(message)
            self.cursors[partition] += 1
        self.held_total += len(messages)
        self.fed = True
        return True

    # -- delivering ---------------------------------------------------------------------------

    async def _get(self, lane: int = LANE_ALL) -> tuple[int, StoredMessage, bool] | None:
        """basic.get: from a partition no consumer holds (a held one keeps its order)."""
        if self.holders.stale or self.holders.orphans:
            self._assign()
        self._from = UNHELD
        try:
            taken = self.take()
            while taken is None and not self.exhausted:
                await self.fill()
                taken = self.take()
            return taken
        finally:
            self._from = ANY

    def _pump(self, quota: int, byte_limit: TokenBucket | None, now: float) -> PumpResult:
        if self.holders.stale or self.holders.orphans:
            self._assign()
        delivered = 0
        now_ms = self.clock.wall_ms()
        readable = self.readable
        owners = self.holders.owners
        n = len(readable)
        waiting = False  # messages held for a consumer without credit
        try:
            while delivered < quota:
                progress = False
                for k in range(n):
                    p = readable[(self._rr + k) % n]
                    if not (self.back[p] or self.pending[p]):
                        continue
                    owner = owners.get(p)
                    if owner is None:  # an orphan: an ack or a requeue wakes the queue
                        waiting = True
                        continue
                    if not owner.has_credit():
                        waiting = True
                        continue
                    self._from = p
                    taken = self.take(now_ms)
                    if taken is None:
                        continue
                    partition, message, redelivered = taken
                    owner.sink.deliver(owner, self, partition, message, redelivered)
                    delivered += 1
                    self.delivered += 1
                    progress = True
                    if byte_limit is not None:
                        byte_limit.take(len(message.body), now)
                        if byte_limit.available(now) < 1:
                            self.rate_wake_at = byte_limit.next_token_at(now)
                            return PumpResult.RATE_LIMITED
                    if delivered >= quota:
                        self._rr = (self._rr + k + 1) % max(n, 1)
                        return PumpResult.QUOTA_USED
                if not progress:
                    break
        finally:
            self._from = ANY
        if waiting:
            return self._no_consumer_ready()
        return PumpResult.NO_MESSAGES
