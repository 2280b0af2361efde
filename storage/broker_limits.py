"""What a broker adds to the store for several gateways sharing it: length limits checked
where every append meets (``refuse_over_limits``) and reads held until there is something to
read (``ReadWaits``). storage/broker.py uses both; docs/broker-protocol.md describes them.

Counting for a limit: per queue, the records after the queue's committed offset, summed over
the partitions this broker holds (``end - committed``). The committed offset is the lowest
unacknowledged one, so the count is ready + unacknowledged (RabbitMQ counts ready only), and
the gateways commit every second or so, so acknowledgements reach it that much later.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import anyio

from storage.errors import UnknownQueue
from storage.port import StorePort
from storage.record import Record
from storage.results import QUEUE_GROUP


async def refuse_over_limits(
    store: StorePort, records: Sequence[Record], limits: Sequence[tuple[int, int]]
) -> tuple[list[Record], list[tuple[int, int, int]]]:
    """The records with each destination that would pass its queue's limit taken out (a
    record left with none is not stored), and the refused (record index, queue, partition).
    Called with nothing in between it and the append (no await after the counts are taken)."""
    counts: dict[int, tuple[int, int]] = {}  # queue id -> (count, limit)
    for queue_id, limit in limits:
        try:
            stats = await store.queue_stats(queue_id, QUEUE_GROUP)
        except UnknownQueue:
            continue  # the append answers for it
        counts[queue_id] = (sum(p.max_offset - p.committed for p in stats.partitions), limit)
    if not counts:
        return list(records), []
    kept: list[Record] = []
    refused: list[tuple[int, int, int]] = []
    for index, record in enumerate(records):
        destinations = record.destinations
        if not any(queue_id in counts for queue_id, _ in destinations):
            kept.append(record)
            continue
        admitted = []
        for queue_id, partition in destinations:
            counted = counts.get(queue_id)
            if counted is not None:
                count, limit = counted
                if count + 1 > limit:
                    refused.append((index, queue_id, partition))
                    continue
                counts[queue_id] = (count + 1, limit)
            admitted.append((queue_id, partition))
        if len(admitted) == len(destinations):
            kept.append(record)
        elif admitted:
            kept.append(record._replace(destinations=tuple(admitted)))
    return kept, refused


class ReadWaits:
    """Reads held until their partition has new records: one event per (queue, partition)
    somebody waits on, set (and dropped) by the appends that reach it, and by a delete or
    purge of its queue. A waiter takes the event before it reads, so an append landing
    between its read and its wait still wakes it. Nothing polls."""

    def __init__(self) -> None:
        self._events: dict[tuple[int, int], anyio.Event] = {}
        self.resets: dict[int, int] = {}  # queue id -> purges and deletes seen (they end waits)

    def __len__(self) -> int:
        return len(self._events)

    def event(self, key: tuple[int, int]) -> anyio.Event:
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = anyio.Event()
        return event

    def wake(self, keys: Iterable[tuple[int, int]]) -> None:
        events = self._events
        for key in keys:
            event = events.pop(key, None)
            if event is not None:
                event.set()

    def wake_all(self) -> None:
        self.wake(list(self._events))

    def wake_queue(self, queue_id: int) -> None:
        """A purge or delete: the queue's held reads answer (with whatever a read finds)."""
        self.resets[queue_id] = self.resets.get(queue_id, 0) + 1
        self.wake([key for key in self._events if key[0] == queue_id])
