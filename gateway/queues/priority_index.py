"""The index of a priority queue's ready messages (gateway/queues/priority.py), one ``Level``
per priority, each in delivery order:
  returned  requeued messages, a heap by commit offset: older than anything else there;
  loaded    messages in memory, in log order;
  pending   messages known only by position, after loaded: (partition, offset) packed in
            8 bytes each, so a backlog of any size costs 8 bytes a message here.
A message's priority is read from its property bytes (``message_priority``), so the index
can be rebuilt from the log after a restart.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.amqp import property_bytes as pb
from storage import StoredMessage

MAX_PRIORITY_ARG = "x-max-priority"
MAX_PRIORITY = 255  # RabbitMQ's ?MAX_SUPPORTED_PRIORITY
_OFFSET_BITS = 48  # a position packs (partition, offset); offsets stay far below 2**48
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1


def max_priority_of(arguments: Mapping[str, Any]) -> int | None:
    """The queue's maximum priority; None for a queue without priorities."""
    value = arguments.get(MAX_PRIORITY_ARG)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_PRIORITY:
        return value
    return None


def message_priority(properties: bytes | memoryview, maximum: int) -> int:
    """The message's priority capped at ``maximum`` (0 without one), read from the property
    bytes without decoding them (rabbit_priority_queue:priority/2)."""
    if len(properties) < 3:
        return 0
    flags = properties[0] << 8 | properties[1]
    if not flags & pb.PRIORITY:
        return 0
    pos = 2
    try:
        if flags & pb.CONTENT_TYPE:
            pos += 1 + properties[pos]
        if flags & pb.CONTENT_ENCODING:
            pos += 1 + properties[pos]
        if flags & pb.HEADERS:
            pos += 4 + int.from_bytes(properties[pos : pos + 4], "big")
        if flags & pb.DELIVERY_MODE:
            pos += 1
        return min(properties[pos], maximum)
    except IndexError:
        return 0


class Positions:
    """Messages known only by position, in log order: (partition, offset) packed in an int64
    each, consumed from the front."""

    __slots__ = ("_head", "_items")

    def __init__(self) -> None:
        self._items = array("q")
        self._head = 0  # the first position not consumed yet

    def __len__(self) -> int:
        return len(self._items) - self._head

    def __iter__(self) -> Iterator[tuple[int, int]]:
        items = self._items
        for i in range(self._head, len(items)):
            yield items[i] >> _OFFSET_BITS, items[i] & _OFFSET_MASK

    def append(self, partition: int, offset: int) -> None:
        self._items.append(partition << _OFFSET_BITS | offset)

    def first_run(self, limit: int) -> tuple[int, int, int]:
        """(partition, first offset, count) of the consecutive positions at the front."""
        items, head = self._items, self._head
        first = items[head]
        end = min(len(items), head + limit)
        count = 1
        while head + count < end and items[head + count] == first + count:
            count += 1
        return first >> _OFFSET_BITS, first & _OFFSET_MASK, count

    def runs(self) -> Iterator[tuple[int, int, int]]:
        """Every run of consecutive positions: (partition, first offset, count)."""
        run: list[int] | None = None
        for partition, offset in self:
            if run is not None and run[0] == partition and run[1] + run[2] == offset:
                run[2] += 1
                continue
            if run is not None:
                yield run[0], run[1], run[2]
            run = [partition, offset, 1]
        if run is not None:
            yield run[0], run[1], run[2]

    def advance(self, count: int) -> None:
        self._head += count
        if self._head >= len(self._items):
            self._items, self._head = array("q"), 0
        elif self._head > 4096 and 2 * self._head > len(self._items):
            del self._items[: self._head]  # give the consumed front back now and then
            self._head = 0

    def keep(self, wanted: Callable[[int, int], bool]) -> int:
        """Keep the positions ``wanted`` accepts; returns how many went."""
        before = len(self)
        self._items = array(
            "q",
            (
                partition << _OFFSET_BITS | offset
                for partition, offset in self
                if wanted(partition, offset)
            ),
        )
        self._head = 0
        return before - len(self)


@dataclass(eq=False, slots=True)
class Level:
    """The ready messages of one priority, in delivery order (see the module doc)."""

    returned: list[tuple[int, int, StoredMessage]] = field(default_factory=list)
    loaded: deque[tuple[int, StoredMessage]] = field(default_factory=deque)
    pending: Positions = field(default_factory=Positions)

    def __bool__(self) -> bool:
        return bool(self.returned or self.loaded or len(self.pending))

    @property
    def in_memory(self) -> bool:
        return bool(self.returned or self.loaded)

    def count(self) -> int:
        return len(self.returned) + len(self.loaded) + len(self.pending)


def firsts(entries: Iterable[tuple[int, int]], partitions: int) -> list[tuple[int, int]]:
    """The first (partition, offset) per partition of entries in log order: its lowest."""
    seen: dict[int, int] = {}
    for partition, offset in entries:
        if partition not in seen:
            seen[partition] = offset
            if len(seen) == partitions:
                break
    return list(seen.items())
