"""Priority queues (``x-max-priority``), as RabbitMQ 3.10's classic priority queues behave.

RabbitMQ keeps one backing queue per priority and always works on the highest non-empty one
(rabbit_priority_queue: fetch, drop and dropwhile walk the priorities from the top), so:
- consumers and basic.get get the highest priority first, FIFO within a priority;
- a message without a priority counts as 0, one above the queue's maximum as the maximum;
- a requeued message goes back to its place among the messages of its own priority;
- TTL expiry and max-length drop-head act on that same head: drop-head drops the oldest
  message of the *highest* priority (tests/diff/test_diff_priority.py checks all of these
  against RabbitMQ).

Layout. The messages stay where any queue's messages are, in the queue's log partition(s) in
arrival order; this runtime keeps an index of the ready ones per priority level. The other
layout, a log partition per level, was measured and refused: 256 open index files per queue
at x-max-priority 255, an idle read of every level on each push turn (270 us at 256 levels
against 1 us for one partition), a delivery lease per level in a cluster, and every writer of
records (publish, dead letters, the delayed exchange, redelivery, redrive) would have had to
choose partitions by priority. Here nothing outside this module knows about priorities.

The index per level (gateway/queues/priority_index.py) holds, in delivery order, the
requeued messages, the messages in memory and the positions of the rest.
Before anything is delivered a scan reads the log from the cursors to the end (a higher
priority may be there) and sorts each message into its level: into memory while fewer than
LOADED_MAX messages and LOADED_MAX_BYTES of bodies are, by position beyond that. A level's
front is in memory whenever it was in hand; its positions are read back a run of consecutive
offsets at a time (they hold only that level's messages: one store read, nothing thrown
away). A restart rebuilds the index with the first scan from the committed offsets: the
priority is in each stored message's properties.
Measured (embedded store, 200,000 messages of 100 bytes, 3 levels): the first delivery
after a restart waits 0.47 s for the scan (a FIFO queue's: under 1 ms); the index then holds
13 bytes a message; draining runs at 310k msg/s when each level's messages come in bursts and
110k msg/s when levels alternate one by one (a read per message), against 430k msg/s for a
FIFO queue.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable

import anyio

from gateway.queues import repositioning
from gateway.queues.behaviour import QueueBehaviour
from gateway.queues.clock import SYSTEM_CLOCK, Clock
from gateway.queues.consumer import LANE_ALL
from gateway.queues.consumer_choice import ConsumerChoice
from gateway.queues.dead_letter import DeadLetter
from gateway.queues.priority_index import Level, firsts, max_priority_of, message_priority
from gateway.queues.runtime import QueueRuntime
from gateway.queues.store_reads import FETCH_BATCH, LOW_WATER
from meta.cluster import HandedNote
from meta.models import QueueDef
from storage import DeliveryProgress, ReadStatus, StoredMessage, StorePort

LOADED_MAX = 4 * FETCH_BATCH  # messages kept in memory by a scan (reading back costs a read)
LOADED_MAX_BYTES = 16 << 20
SCAN_YIELD_READS = 16  # a long scan lets the event loop run after this many reads


class PriorityQueueRuntime(QueueRuntime):
    """A queue runtime that delivers by priority (see the module doc)."""

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
        maximum = max_priority_of(definition.arguments)
        self.max_priority = 0 if maximum is None else maximum
        self.levels = [Level() for _ in range(self.max_priority + 1)]
        self._nonempty = 0  # bit n set: level n holds something (the top is the highest bit)
        self.loaded_count = 0
        self.loaded_bytes = 0
        self.scanning = False  # the head is unknown until a scan reaches the end
        self._lock = anyio.Lock()  # one scan or load at a time: they move cursors and positions

    # -- the head -------------------------------------------------------------------------

    def has_buffered(self) -> bool:
        return self._nonempty != 0

    def _top(self) -> Level | None:
        mask = self._nonempty
        return self.levels[mask.bit_length() - 1] if mask else None

    def _needs_load(self) -> bool:
        level = self._top()
        return level is not None and not level.in_memory

    def _peek_head(self) -> StoredMessage | None:
        level = self._top()
        if level is None or self.scanning:
            return None
        if level.returned:
            return level.returned[0][2]
        return level.loaded[0][1] if level.loaded else None

    def _pop_head(self, lane: int = LANE_ALL) -> tuple[int, StoredMessage, bool] | None:
        mask = self._nonempty
        if not mask or self.scanning:
            return None
        index = mask.bit_length() - 1
        level = self.levels[index]
        if level.returned:
            _, partition, message = heapq.heappop(level.returned)
            redelivered = True
        elif level.loaded:
            partition, message = level.loaded.popleft()
            self.loaded_count -= 1
            self.loaded_bytes -= len(message.body)
            redelivered = False
        else:
            self.exhausted = False  # known by position only: the next fill reads it
            return None
        if not level:
            self._nonempty = mask & ~(1 << index)
        if self._needs_load():
            self.exhausted = False
        return partition, message, redelivered

    async def _fetch_head(self, always: bool) -> StoredMessage | None:
        # Unlike a FIFO queue's, the head in hand is not final: a message not scanned yet
        # may outrank it.
        if always or not self.exhausted:
            await self.fill()
        return self._peek_head()

    async def _get(self, lane: int = LANE_ALL) -> tuple[int, StoredMessage, bool] | None:
        if not self.exhausted:  # published since the last scan: it may outrank the head
            await self.fill()
        return await super()._get()

    def _return(self, partition: int, message: StoredMessage) -> None:
        index = message_priority(message.properties, self.max_priority)
        heapq.heappush(self.levels[index].returned, (message.commit_offset, partition, message))
        self._nonempty |= 1 << index

    # -- reading the log ------------------------------------------------------------------

    async def fill(self) -> None:
        """Scan what is new in the log, then bring the top levels' fronts into memory."""
        async with self._lock:
            self.exhausted = False  # no write-through (absorb) while the scan runs
            appends_done = self.appends_done
            self.scanning = True
            try:
                if self.partitions == 1:
                    await self._scan_one()
                else:
                    await self._scan_merged()
            finally:
                self.scanning = False
            await self._load()
            # An append that landed while the scan was out was not absorbed, and its wake
            # set exhausted False before the scan ended: the scan may have read short of it
            # (over a remote store it surely did), so the next turn scans again.
            landed = self.appends_done != appends_done
        self.exhausted = not self._needs_load() and not landed

    def absorb(self, messages: list[tuple[int, StoredMessage]]) -> bool:
        cursors = self.cursors
        for partition, message in messages:
            cursors[partition] += 1
            self._index(partition, message)
        return True

    def _index(self, partition: int, message: StoredMessage) -> None:
        index = message_priority(message.properties, self.max_priority)
        level = self.levels[index]
        full = self.loaded_count >= LOADED_MAX or self.loaded_bytes >= LOADED_MAX_BYTES
        if level.pending or (level.loaded and full):
            level.pending.append(partition, message.queue_offset)
        else:
            level.loaded.append((partition, message))
            self.loaded_count += 1
            self.loaded_bytes += len(message.body)
        self._nonempty |= 1 << index

    async def _read_on(self, partition: int) -> tuple[list[StoredMessage], bool]:
        """The next batch of ``partition`` from its cursor (which moves past it), and whether
        that was the end of the partition."""
        cursor = self.cursors[partition]
        result = await self.store.read(self.queue_id, partition, cursor, FETCH_BATCH)
        if result.status is ReadStatus.MOVED:
            repositioning.lost_to_retention(self, result.min_offset - cursor)
        elif result.status is ReadStatus.OFFSET_OVERFLOW:
            self.behind_copy(partition, cursor)
        self.cursors[partition] = result.next_offset
        return result.messages, result.next_offset >= result.max_offset

    async def _scan_one(self) -> None:
        reads = 0
        while True:
            messages, at_end = await self._read_on(0)
            for message in messages:
                self._index(0, message)
            if at_end or not messages:
                return
            reads += 1
            if reads % SCAN_YIELD_READS == 0:
                await anyio.lowlevel.checkpoint()

    async def _scan_merged(self) -> None:
        """Several partitions: merged by commit offset, the store's arrival order. A cursor
        moves past a message only once it is indexed, so a failed read loses nothing."""
        batches: list[deque[StoredMessage]] = [deque() for _ in range(self.partitions)]
        ended = [False] * self.partitions
        reads = 0
        while True:
            for partition, batch in enumerate(batches):
                if batch or ended[partition]:
                    continue
                cursor = self.cursors[partition]
                result = await self.store.read(self.queue_id, partition, cursor, FETCH_BATCH)
                if result.status is ReadStatus.MOVED:
                    repositioning.lost_to_retention(self, result.min_offset - cursor)
                    self.cursors[partition] = result.min_offset
                elif result.status is ReadStatus.OFFSET_OVERFLOW:
                    self.behind_copy(partition, cursor)
                    self.cursors[partition] = result.next_offset
                batch.extend(result.messages)
                ended[partition] = result.next_offset >= result.max_offset or not batch
                reads += 1
                if reads % SCAN_YIELD_READS == 0:
                    await anyio.lowlevel.checkpoint()
            live = [p for p, batch in enumerate(batches) if batch]
            if not live:
                return
            partition = min(live, key=lambda p: batches[p][0].commit_offset)
            message = batches[partition].popleft()
            self.cursors[partition] = message.queue_offset + 1
            self._index(partition, message)

    async def _load(self) -> None:
        """Read the pending fronts of the top levels, about a fetch batch in all."""
        in_hand = 0
        mask = self._nonempty
        while mask and in_hand < FETCH_BATCH:
            index = mask.bit_length() - 1
            mask &= ~(1 << index)
            level = self.levels[index]
            while level.pending and len(level.loaded) < LOW_WATER:
                await self._load_run(level)
            if not level:  # everything it had was lost to retention
                self._nonempty &= ~(1 << index)
            in_hand += len(level.returned) + len(level.loaded)

    async def _load_run(self, level: Level) -> None:
        partition, first, count = level.pending.first_run(FETCH_BATCH)
        end = first + count
        result = await self.store.read(self.queue_id, partition, first, count)
        start = result.min_offset if result.status is ReadStatus.MOVED else first
        kept = 0
        for message in result.messages:
            if message.queue_offset >= end:
                break
            level.loaded.append((partition, message))
            self.loaded_bytes += len(message.body)
            kept += 1
        self.loaded_count += kept
        lost = min(start, end) - first
        if not kept and lost <= 0:
            lost = end - first  # the store has nothing there any more: do not spin on it
        repositioning.lost_to_retention(self, lost)
        level.pending.advance(min(max(lost, 0) + kept, count))

    # -- offsets, counts and bulk changes -------------------------------------------------

    def delivery_progress(self) -> list[DeliveryProgress] | None:
        return None  # levels read out of offset order: others count from committed offsets

    def committed_offsets(self) -> list[int]:
        lowest = super().committed_offsets()
        for level in self.levels:
            for _, partition, message in level.returned:
                lowest[partition] = min(lowest[partition], message.queue_offset)
            for partition, offset in firsts(
                ((p, m.queue_offset) for p, m in level.loaded), self.partitions
            ):
                lowest[partition] = min(lowest[partition], offset)
            for partition, offset in firsts(level.pending, self.partitions):
                lowest[partition] = min(lowest[partition], offset)
        return lowest

    async def _held_bytes(self) -> int:
        total = self.loaded_bytes
        total += sum(len(m.body) for level in self.levels for _, _, m in level.returned)
        runs = [run for level in self.levels for run in level.pending.runs()]  # a snapshot
        for partition, first, count in runs:
            offset, end = first, first + count
            while offset < end:
                result = await self.store.read(
                    self.queue_id, partition, offset, min(end - offset, FETCH_BATCH)
                )
                if not result.messages:
                    break
                total += sum(len(m.body) for m in result.messages if m.queue_offset < end)
                offset = result.next_offset
        return total

    async def drop_stored_before(self, cut_ts_ms: int, why: str) -> int:
        async with self._lock:  # it moves cursors, which a scan must not see change
            return await super().drop_stored_before(cut_ts_ms, why)

    async def _drop_held_before(self, cut_ts_ms: int) -> tuple[int, bool]:
        cuts = [
            await self.store.offset_for_time(self.queue_id, p, cut_ts_ms)
            for p in range(self.partitions)
        ]
        dropped = 0
        exact = True
        for level in self.levels:
            old = [(p, m) for p, m in level.loaded if m.store_ts_ms < cut_ts_ms]
            old += [(p, m) for _, p, m in level.returned if m.store_ts_ms < cut_ts_ms]
            for partition, message in old:
                self.ready_bytes -= len(message.body)
                self.returns.pop((partition, message.queue_offset), None)
            dropped += len(old)
            level.loaded = deque(e for e in level.loaded if e[1].store_ts_ms >= cut_ts_ms)
            level.returned = [e for e in level.returned if e[2].store_ts_ms >= cut_ts_ms]
            heapq.heapify(level.returned)
            gone = level.pending.keep(lambda partition, offset: offset >= cuts[partition])
            if gone:
                dropped += gone
                exact = False  # their sizes are not known without reading them
        self._reindex()
        return dropped, exact

    async def take_over(self, partition: int, handed: HandedNote | None = None) -> None:
        async with self._lock:
            await super().take_over(partition, handed)
            self.ready_count += sum(level.count() for level in self.levels)

    async def hand_over(self, partition: int) -> int:
        async with self._lock:  # a scan must not index into what is dropped
            return await super().hand_over(partition)

    def _forget_partition(self, partition: int) -> None:
        super()._forget_partition(partition)
        for level in self.levels:
            level.returned = [e for e in level.returned if e[1] != partition]
            heapq.heapify(level.returned)
            level.loaded = deque(e for e in level.loaded if e[0] != partition)
            level.pending.keep(lambda p, _offset: p != partition)
        self._reindex()

    async def purge(self) -> int:
        async with self._lock:
            self.levels = [Level() for _ in range(self.max_priority + 1)]
            self._reindex()
            return await super().purge()

    def _reindex(self) -> None:
        """Recompute the level mask and the loaded window after a bulk change."""
        self._nonempty = sum(1 << i for i, level in enumerate(self.levels) if level)
        self.loaded_count = sum(len(level.loaded) for level in self.levels)
        self.loaded_bytes = sum(len(m.body) for level in self.levels for _, m in level.loaded)
        if self._needs_load():
            self.exhausted = False
