"""What a broker adds to the store for several gateways sharing it: length limits checked
where every append meets (``refuse_over_limits``, with ``ReadyBytes`` for byte limits) and
reads held until there is something to read (``ReadWaits``). storage/broker/server.py uses them;
docs/broker-protocol.md describes them.

Counting for a limit: per queue, summed over the partitions this broker holds, the ready
messages: from the delivering gateway's progress report when there is one (``end - next
offset + ready behind``: ready only, as RabbitMQ counts; what was delivered since the report,
at most a fraction of a second, still counts), else the records after the queue's committed
offset (``end - committed``: ready + unacknowledged). For x-max-length-bytes, the body bytes
after the committed offset (a report tells no bytes), so unacknowledged bytes count there,
and acknowledgements reach the count with the next commit (about a second). A destination
is refused when one more message would pass a limit (count + 1 > max length, bytes + body >
max length bytes), as RabbitMQ's classic queue decides (rabbit_amqqueue_process:will_overflow)
and the embedded gateway does.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence

import anyio

from storage.errors import UnknownQueue
from storage.port import StorePort
from storage.record import Record
from storage.results import QUEUE_GROUP, PartitionStats

READ_BATCH = 1024  # entries per read when sums are (re)built from the store
TRIM_ENTRIES = 4096  # sums below the committed offset kept before they are dropped
IDLE_APPENDS = 1024  # appends counted without a byte-limit check: the queue lost its limit


class _Room:
    """One queue's standing while a batch is checked: what it holds and its limits."""

    __slots__ = ("bytes", "count", "max_bytes", "max_length")

    def __init__(self) -> None:
        self.count = 0
        self.bytes = 0
        self.max_length: int | None = None
        self.max_bytes: int | None = None

    def takes(self, size: int) -> bool:
        """Admit one message of ``size`` body bytes unless it would pass a limit."""
        if self.max_length is not None and self.count + 1 > self.max_length:
            return False
        if self.max_bytes is not None and self.bytes + size > self.max_bytes:
            return False
        self.count += 1
        self.bytes += size
        return True


async def refuse_over_limits(
    store: StorePort,
    records: Sequence[Record],
    limits: Sequence[tuple[int, int]],
    byte_limits: Sequence[tuple[int, int]] = (),
    ready_bytes: ReadyBytes | None = None,
) -> tuple[list[Record], list[tuple[int, int, int]]]:
    """The records with each destination that would pass its queue's limit taken out (a
    record left with none is not stored), and the refused (record index, queue, partition).
    ``limits``: (queue id, max length); ``byte_limits``: (queue id, max length bytes),
    counted by ``ready_bytes`` (the broker's, kept across appends; a fresh one reads the
    ready range back). Called with nothing in between it and the append: the store's stats
    and reads do not yield to other tasks, so the counts still hold when the append runs."""
    rooms: dict[int, _Room] = {}
    for queue_id, limit in limits:
        rooms.setdefault(queue_id, _Room()).max_length = limit
    for queue_id, limit in byte_limits:
        rooms.setdefault(queue_id, _Room()).max_bytes = limit
    if byte_limits and ready_bytes is None:
        ready_bytes = ReadyBytes(store)
    for queue_id, limited in list(rooms.items()):
        try:
            stats = await store.queue_stats(queue_id, QUEUE_GROUP)
        except UnknownQueue:
            del rooms[queue_id]  # the append answers for it
            continue
        limited.count = sum(p.ready for p in stats.partitions)
        if limited.max_bytes is not None and ready_bytes is not None:
            limited.bytes = await ready_bytes.count(queue_id, stats.partitions)
    if not rooms:
        return list(records), []
    kept: list[Record] = []
    refused: list[tuple[int, int, int]] = []
    for index, record in enumerate(records):
        destinations = record.destinations
        if not any(queue_id in rooms for queue_id, _ in destinations):
            kept.append(record)
            continue
        admitted = []
        size = len(record.body)
        for queue_id, partition in destinations:
            room = rooms.get(queue_id)
            if room is not None and not room.takes(size):
                refused.append((index, queue_id, partition))
                continue
            admitted.append((queue_id, partition))
        if len(admitted) == len(destinations):
            kept.append(record)
        elif admitted:
            kept.append(record._replace(destinations=tuple(admitted)))
    return kept, refused


class _Sums:
    """Body bytes of one partition's entries from ``base`` on, as running sums: ``sums[i]``
    totals entries base .. base + i - 1, so the bytes of any range are one subtraction."""

    __slots__ = ("base", "idle", "sums")

    def __init__(self, base: int) -> None:
        self.base = base
        self.sums = array("q", [0])
        self.idle = 0  # appends added since the last count

    @property
    def end(self) -> int:
        return self.base + len(self.sums) - 1

    def extend(self, sizes: Iterable[int]) -> None:
        sums = self.sums
        total = sums[-1]
        for size in sizes:
            total += size
            sums.append(total)

    def between(self, low: int, high: int) -> int:
        low, high = max(low, self.base), min(high, self.end)
        return self.sums[high - self.base] - self.sums[low - self.base] if high > low else 0

    def trim(self, low: int) -> None:
        """Forget what lies below ``low`` once that is most of it (amortised O(1))."""
        drop = min(low, self.end) - self.base
        if drop > TRIM_ENTRIES and drop * 2 > len(self.sums):
            del self.sums[:drop]
            self.base += drop


class ReadyBytes:
    """Body bytes after the committed offset of the partitions of byte-limited queues, kept
    per (queue, partition) as running sums that every append adds its bodies to, so a check
    is a subtraction per partition, not a read. Sums are built by reading the ready range
    back once: when a queue is first checked, after a missed or inconsistent append, when
    the committed offset moved back (a reset), and after the broker's role epoch changed
    (``era``: a replicated log may have been truncated and refilled meanwhile). Sums of a
    queue that stopped being checked (its limit went) are dropped after IDLE_APPENDS."""

    def __init__(self, reader: StorePort, era: Callable[[], object] = lambda: None) -> None:
        self.reader = reader  # reads the whole log (a replicated master's past its confirm)
        self.era = era
        self._era: object = None
        self._parts: dict[tuple[int, int], _Sums] = {}
        self.entries_read = 0  # entries read back to build sums (tests watch it)

    def __len__(self) -> int:
        return len(self._parts)

    async def count(self, queue_id: int, partitions: Iterable[PartitionStats]) -> int:
        """Body bytes after the committed offset, summed over ``partitions`` (the store's
        stats taken just before)."""
        era = self.era()
        if era != self._era:
            self._parts.clear()
            self._era = era
        total = 0
        for stats in partitions:
            key = (queue_id, stats.partition)
            high = stats.max_offset
            low = min(stats.committed, high)
            sums = self._parts.get(key)
            if sums is None or low < sums.base or sums.end > high:
                sums = self._parts[key] = _Sums(low)
            if sums.end < high:
                await self._read_into(sums, key, high)
            sums.idle = 0
            total += sums.between(low, high)
            sums.trim(low)
        return total

    async def _read_into(self, sums: _Sums, key: tuple[int, int], high: int) -> None:
        queue_id, partition = key
        while sums.end < high:
            result = await self.reader.read(queue_id, partition, sums.end, READ_BATCH)
            messages = result.messages
            if not messages:
                return  # the range shrank under us: count what is there
            if messages[0].queue_offset != sums.end:  # retention moved the start: restart
                sums.base, sums.sums = messages[0].queue_offset, array("q", [0])
            sums.extend(len(m.body) for m in messages[: high - sums.end])
            self.entries_read += len(messages)

    def appended(
        self, records: Sequence[Record], starts: Mapping[tuple[int, int], int] | None
    ) -> None:
        """An append stored ``records``; ``starts``: the first offset it wrote per (queue,
        partition). Each tracked partition takes the bodies of the records reaching it."""
        parts = self._parts
        if not parts or not starts:
            return
        for key, start in starts.items():
            sums = parts.get(key)
            if sums is None:
                continue
            sums.idle += 1
            if sums.end > start or sums.idle > IDLE_APPENDS:
                del parts[key]  # out of step (or no longer checked): rebuilt when needed
            elif sums.end == start:  # else some append was missed: the next count reads
                sums.extend(_sizes_to(key, records))

    def forget(self, queue_id: int) -> None:
        """The queue was deleted (its id and offsets may come back with a new queue)."""
        for key in [key for key in self._parts if key[0] == queue_id]:
            del self._parts[key]


def _sizes_to(key: tuple[int, int], records: Sequence[Record]) -> list[int]:
    """Body sizes of the records that reach ``key``, in order."""
    sizes = []
    last: object = None
    reaches = False
    for record in records:
        destinations = record.destinations
        if destinations is not last:  # batches usually repeat one destination tuple
            last = destinations
            reaches = key in destinations
        if reaches:
            sizes.append(len(record.body))
    return sizes


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
