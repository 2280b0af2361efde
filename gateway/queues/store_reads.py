"""How a queue runtime reads its partitions from the store: the positions it resumes from at
start, batches read past each cursor and merged by commit offset into the buffer (``fill``),
the batch in hand taken straight after its append (``caught_up``, ``absorb``), and the ready
count against the store's ends. Reads drop what is never delivered: a scaled queue's command
records, and the transient messages stored before the store last opened. On a cluster, a read
carries the partition's fencing token and a refusal loses the lease (leases.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Self

from gateway.queues.queue_state import QueueState
from meta.queue_route import COMMAND_EXCHANGE
from storage import QUEUE_GROUP, PartitionStats, ReadResult, ReadStatus, StoredMessage
from storage.errors import StaleFence
from storage.record import PERSISTENT

COMMAND = COMMAND_EXCHANGE.encode()  # a route change's command record: never delivered

FETCH_BATCH = 256
LOW_WATER = 64


class StoreReads(QueueState):
    """Read positions and reads: from the store into what the queue holds."""

    if TYPE_CHECKING:
        # Provided by the other parts of QueueRuntime (held_messages.py, leases.py,
        # scaled_route.py, runtime.py).
        def held_count(self) -> int: ...
        def lose_lease(self, partition: int, error: StaleFence, fence: int) -> None: ...
        def note_replaced(self, partition: int, fence: int, end: int) -> None: ...
        def is_removed(self, partition: int) -> bool: ...
        def pass_removed_records(self) -> None: ...
        def _lost_to_retention(self, count: int) -> None: ...
        async def recount_bytes(self) -> None: ...

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
        parts = self.read_parts
        if self.delivery_slot is not None and self.leases is not None:  # spread: ours only
            parts = [p for p in parts if self.leases[p] and p not in self.leaving]
        read, ends, more = await self._read_partitions(parts)
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
        answered: list[tuple[int, int, ReadResult]] = []  # (partition, start, answer)
        for p in partitions:
            start, fence = self.cursors[p], self.fences[p]
            try:
                # Cluster: with the lease's token, so that once another gateway has taken the
                # partition over this one reads nothing more to deliver (StaleFence).
                result = await self.store.read(self.queue_id, p, start, FETCH_BATCH, fence=fence)
            except StaleFence as error:
                self.lose_lease(p, error, fence)
                continue
            answered.append((p, start, result))
        # The cursors move only now, when every read is back and the caller buffers what this
        # returns before anything else runs. Moved as each answer came, a commit while the
        # next partition's read was out passed messages not yet buffered (lost at a hand-over
        # that followed), and a read that failed left the earlier ones skipped.
        for p, start, result in answered:
            if self.cursors[p] != start:
                # Moved while the read was out (a delivery-lease take-over, a reset): this
                # answer is for the old position; taking it would skip what lies between.
                more = True
                continue
            if result.replaced_fence:
                self.note_replaced(p, result.replaced_fence, result.replaced_end)
            if result.status is ReadStatus.MOVED:
                self._lost_to_retention(result.min_offset - self.cursors[p])
            elif result.status is ReadStatus.OFFSET_OVERFLOW:
                self.behind_copy(p, start)
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

    def behind_copy(self, partition: int, cursor: int) -> None:
        """A read at ``cursor`` found the copy read ending below it: the group failed over
        to a copy that lacks what this gateway read on the old master (nemesis seed 108).
        Reading goes on from the copy's end (what lands there next may be new messages,
        never to be skipped), and what lies below ``cursor`` is flagged redelivered: read
        there again, it may be what went out from the old master."""
        self.maybe_delivered[partition] = max(self.maybe_delivered[partition], cursor)

    def _filled(self: Self, ends: list[tuple[int, int, int]], more: bool) -> None:
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
        if self.broadcast:
            return False  # its consumers read through their own positions
        if self.buffer and len(self.buffer) >= LOW_WATER:
            return False
        qid = self.queue_id
        cursors = self.cursors
        if len(cursors) == 1:
            return starts.get((qid, 0), cursors[0]) == cursors[0]
        return all(starts.get((qid, p), cursor) == cursor for p, cursor in enumerate(cursors))

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
