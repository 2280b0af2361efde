"""The FIFO store layout of a queue runtime: the messages read from the store and not handed
out, as a buffer in arrival (commit offset) order and a heap of requeued messages delivered
before anything newer. These are the head and buffer operations a store layout other than
FIFO overrides (gateway/queues/priority.py, ordered.py, gray_lanes.py): taking and peeking at
the head, putting a message back, what is held of a partition, dropping what is held (a
partition handed over, retention), and the bytes held. Reading the store into the buffer is
store_reads.py's; nothing here reads the store but ``_fetch_head``, through ``fill``.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gateway.queues.consumer import LANE_ALL
from gateway.queues.queue_state import QueueState
from storage import StoredMessage


class HeldMessages(QueueState):
    """The buffer and the requeue heap: the head operations of a FIFO queue."""

    if TYPE_CHECKING:
        # Provided by the other parts of QueueRuntime (store_reads.py).
        async def fill(self) -> None: ...

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

    def _return(self, partition: int, message: StoredMessage) -> None:
        """Back in the queue, before every newer message (RabbitMQ keeps its place)."""
        heapq.heappush(self.requeued, (message.commit_offset, partition, message))

    async def _fetch_head(self, always: bool) -> StoredMessage | None:
        """The next message to leave, read from the store if need be (None: no message).
        ``always``: read even if the last fetch reached the end (messages may have been
        appended since, before the wake-up that would say so)."""
        head = self._peek_head()
        if head is None and (always or not self.exhausted):
            await self.fill()
            head = self._peek_head()
        return head

    def held_count(self) -> int:
        """Messages read from the store and not handed out (buffered, requeued, parked)."""
        return len(self.buffer) + len(self.requeued) + len(self.parked)

    def held(self) -> Iterator[tuple[int, StoredMessage]]:
        """Those messages, as (partition, message)."""
        yield from self.buffer
        for _, partition, message in self.requeued:
            yield partition, message
        yield from self.parked

    def park(self, partition: int, message: StoredMessage) -> None:
        """Met at the head while ``partition``'s lease is not held here (see ``parked``)."""
        self.parked.append((partition, message))

    def unpark(self, partition: int) -> None:
        """The lease was kept after all: its parked messages go back, ahead of newer ones
        (flagged redelivered: harmless, as AMQP's flag says only "may have been")."""
        if not self.parked:
            return
        for p, message in self.parked:
            if p == partition:
                self._return(p, message)
        self.parked = [item for item in self.parked if item[0] != partition]

    def clear_held(self) -> None:
        """Forget what was read and not handed out (purge, reset: positions move)."""
        self.buffer.clear()
        self.requeued.clear()
        self.parked.clear()

    def _holds_of(self, partition: int) -> bool:
        """Messages of ``partition`` read and not handed out."""
        return (
            any(p == partition for p, _ in self.buffer)
            or any(p == partition for _, p, _ in self.requeued)
            or any(p == partition for p, _ in self.parked)
        )

    def _forget_partition(self, partition: int) -> None:
        """Drop what was read of ``partition`` and not handed out (or handed back)."""
        self.buffer = deque(item for item in self.buffer if item[0] != partition)
        requeued = [item for item in self.requeued if item[1] != partition]
        heapq.heapify(requeued)
        self.requeued = requeued
        self.parked = [item for item in self.parked if item[0] != partition]

    async def _held_bytes(self) -> int:
        """Body bytes of the ready messages read from the store already."""
        total = sum(len(m.body) for _, m in self.buffer)
        return total + sum(len(m.body) for _, _, m in self.requeued)

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
