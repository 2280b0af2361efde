"""A node-wide durable timer made of log-store primitives (RocketMQ's delay levels).

Everything that must come back later (delayed-exchange messages; redelivery backoff next) is a
record in ONE internal store queue, ``TIMER_QUEUE_ID``, whose partitions are delay *levels*.
A record appended to level L waits ``levels_ms[L]`` there. Store timestamps never decrease, so
within a level "ripe" time (store_ts + levels_ms[L]) follows append order: the head of each
level is all there is to watch. The timer costs one cursor per level, not memory per message.

When a level's head is ripe the timer reads it and looks at the absolute due time inside:
- past due: fire it (its kind's handler gets a batch and appends what it causes);
- due in less than the smallest non-zero level: into a small in-memory heap, fired from there;
- otherwise: re-appended to the largest level <= the time left (a *hop*).
Level 0 waits 0 ms, so a record for a short delay is read at once and waits in the heap.
A due time is only ever acted on once it has passed (``due < now`` in whole ms), so nothing
fires early whatever the levels are, and levels may be reconfigured between runs.

Durability (at-least-once): an item is *settled* only once its handler has returned (having
appended its effect durably) or its hop record is appended (durably under ``flush = "sync"``).
Each level's committed offset (group ``QUEUE_GROUP``) is its lowest unsettled offset; it is
written every second and at shutdown.
After a crash, items read but not settled are read again: a fired item may fire twice, a
hopped one may exist twice (both copies fire). None is lost.

Timer record layout (a normal store record; the envelope rides in its properties field so the
body is never copied on schedule or hop):

    record.exchange     original exchange          record.routing_key  routing key
    record.body         message body               record.flags        store flags (persistent)
    record.born_ts_ms   publisher's time           destinations        ((TIMER_QUEUE_ID, level),)
    record.properties   envelope, little-endian:
        0  u8   version (1)           1  u8   kind (whose handler fires it; see below)
        2  u16  attempt               4  i64  due time, ms since the epoch
        12 u16  vhost length          14 u8   target length      15 u8  tag (kind-specific bits)
        16 ...  vhost, target (exchange or queue name), then the raw AMQP properties

Kinds: 1 = delayed-message exchange (gateway/features/delayed_exchange.py).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple

import anyio

from storage import QUEUE_GROUP, ReadStatus, Record, StoredMessage, StoreError, StorePort

log = logging.getLogger("mqgw.timer")

TIMER_QUEUE_ID = 0xFFFF0001  # far above metadata's counter; Node.start keeps it
MAX_LEVELS = 32  # the queue's partition count: fixed, so levels can change between runs
_S, _M, _H = 1000, 60_000, 3_600_000
DEFAULT_LEVELS_MS: tuple[int, ...] = (
    0,
    *(_S * s for s in (1, 5, 10, 30)),
    *(_M * m for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20, 30)),
    *(_H * h for h in (1, 2, 4, 8, 16, 32, 64, 128)),
)
ENVELOPE = struct.Struct("<BBHqHBB")
VERSION = 1
READ_BATCH = 256
PASS_BUDGET = 1024  # items read per level per pass, so one pass is one bounded append
HEAP_MAX_BYTES = 64 << 20  # beyond this, ripe items stay on disk until the heap drains
COMMIT_INTERVAL_MS = 1000
IDLE_CHECK_S = 1.0  # a record scheduled inside a transaction is appended after schedule()
RETRY_MS = 1000
# A hop read a few ms after its ripe time still takes the level it was meant for (one hop,
# not a cascade down the ladder); it costs at most this much lateness, never earliness.
HOP_SLACK_MS = 10


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class TimerMessage(NamedTuple):
    """What a timer record carries besides its timing: the message and where it belongs."""

    vhost: str
    target: str  # exchange or queue name, by kind
    exchange: bytes
    routing_key: bytes
    properties: bytes  # raw AMQP properties
    body: bytes | bytearray  # as the publish assembled it (see events.Publish)
    flags: int = 0  # store record flags (persistent)
    born_ts_ms: int = 0


class TimerItem(NamedTuple):
    """A timer record read back and decoded: what fire handlers get."""

    kind: int
    due_ms: int
    attempt: int
    tag: int
    message: TimerMessage
    level: int
    offset: int
    envelope: bytes  # the stored properties field, reused as is by a hop

    def record(self, level: int) -> Record:
        """The same timer record, destined for ``level``."""
        m = self.message
        destinations = ((TIMER_QUEUE_ID, level),)
        return Record(
            m.exchange, m.routing_key, self.envelope, m.body, destinations, m.born_ts_ms, m.flags
        )


# Appends the items' effects durably before it returns; a StoreError means "not done, retry".
FireHandler = Callable[[list[TimerItem]], Awaitable[None]]


def timer_record(
    kind: int, due_ms: int, level: int, message: TimerMessage, attempt: int = 0, tag: int = 0
) -> Record:
    m = message
    vhost, target = m.vhost.encode(), m.target.encode()
    head = ENVELOPE.pack(VERSION, kind, attempt, due_ms, len(vhost), len(target), tag)
    envelope = b"".join((head, vhost, target, m.properties))
    destinations = ((TIMER_QUEUE_ID, level),)
    return Record(m.exchange, m.routing_key, envelope, m.body, destinations, m.born_ts_ms, m.flags)


def decode_item(stored: StoredMessage, level: int) -> TimerItem:
    """Raises ValueError for a record that is not a timer envelope."""
    envelope = bytes(stored.properties)
    if len(envelope) < ENVELOPE.size:
        raise ValueError("timer envelope too short")
    version, kind, attempt, due_ms, vhost_len, target_len, tag = ENVELOPE.unpack_from(envelope)
    if version != VERSION:
        raise ValueError(f"timer envelope version {version}")
    pos = ENVELOPE.size
    vhost = envelope[pos : pos + vhost_len].decode()
    pos += vhost_len
    target = envelope[pos : pos + target_len].decode()
    pos += target_len
    message = TimerMessage(
        vhost,
        target,
        stored.exchange,
        stored.routing_key,
        envelope[pos:],
        bytes(stored.body),
        stored.flags,
        stored.born_ts_ms,
    )
    return TimerItem(kind, due_ms, attempt, tag, message, level, stored.queue_offset, envelope)


class LogTimer:
    def __init__(
        self,
        store: StorePort,
        levels_ms: Sequence[int] = DEFAULT_LEVELS_MS,
        clock: Callable[[], int] = wall_clock_ms,
        max_level_ms: int | None = None,
    ) -> None:
        """``max_level_ms``: longest level to schedule into (keep it well under retention:
        a record must be read before retention can delete its segment)."""
        levels = list(levels_ms)
        if not levels or levels[0] != 0 or len(levels) > MAX_LEVELS:
            raise ValueError(f"levels must start at 0 and number at most {MAX_LEVELS}")
        if any(b <= a for a, b in itertools.pairwise(levels)):
            raise ValueError("levels must increase")
        self.store = store
        self.clock = clock
        self.levels_ms = levels
        # Levels we schedule into; partitions past the configured ones drain with delay 0.
        cap = max_level_ms if max_level_ms is not None else levels[-1]
        self._usable = [d for d in levels if d <= cap] or [0]
        self._delays = levels + [0] * (MAX_LEVELS - len(levels))
        self._min_step = levels[1] if len(levels) > 1 else 1 << 62
        self._handlers: dict[int, FireHandler] = {}
        self._cursors = [0] * MAX_LEVELS  # next offset to read, per level
        self._head_ripe: list[int | None] = [None] * MAX_LEVELS  # None: empty or unknown
        self._pending: list[set[int]] = [set() for _ in range(MAX_LEVELS)]  # read, unsettled
        self._committed = [0] * MAX_LEVELS
        self._heap: list[tuple[int, int, TimerItem]] = []
        self._heap_bytes = 0
        self._sequence = itertools.count()
        self._retry: list[TimerItem] = []
        self._retry_at = 0
        self._last_commit = 0
        self._hopped = False  # hop records appended: learn the new heads at once
        self._wakeup = anyio.Event()
        self.fired = 0
        self.hops = 0
        self.dropped = 0  # undecodable, no handler, handler failed, or lost to retention

    # -- API --------------------------------------------------------------------------

    def register(self, kind: int, handler: FireHandler) -> None:
        """``handler(items)`` makes the items' effect durable (e.g. appends messages) before it
        returns. StoreError: retried later; any other exception: the items are dropped."""
        self._handlers[kind] = handler

    def level_for(self, remaining_ms: int) -> int:
        """The largest schedulable level that does not exceed ``remaining_ms``."""
        return max(0, bisect.bisect_right(self._usable, remaining_ms) - 1)

    def schedule(
        self,
        kind: int,
        due_ms: int,
        message: TimerMessage,
        attempt: int = 0,
        tag: int = 0,
        now_ms: int | None = None,
    ) -> Record:
        """The timer record for an item due at ``due_ms``; the caller appends it.

        ``now_ms``: when the delay started (default: now), so a delay of exactly one level
        lands on that level rather than the one below it."""
        start = self.clock() if now_ms is None else now_ms
        self.notify()
        return timer_record(kind, due_ms, self.level_for(due_ms - start), message, attempt, tag)

    def schedule_at_level(
        self, kind: int, level: int, message: TimerMessage, attempt: int = 0, tag: int = 0
    ) -> Record:
        """For fixed ladders (backoff: level k for attempt k): due ``levels_ms[level]`` from now."""
        now_ms = self.clock()
        return self.schedule(kind, now_ms + self.levels_ms[level], message, attempt, tag, now_ms)

    async def add(self, records: Sequence[Record]) -> None:
        """Append scheduled records (durably) and wake the timer."""
        await self.store.append(records)
        self.notify()

    def notify(self) -> None:
        self._wakeup.set()

    async def start(self) -> None:
        """Create (or find) the timer queue and resume from the committed offsets."""
        await self.store.create_queue(TIMER_QUEUE_ID, MAX_LEVELS)
        for level in range(MAX_LEVELS):
            offset = await self.store.committed_offset(QUEUE_GROUP, TIMER_QUEUE_ID, level)
            self._cursors[level] = self._committed[level] = offset
        self._last_commit = self.clock()

    async def pending_per_level(self) -> list[int]:
        """Items not yet settled, per configured level (offset arithmetic, no scan)."""
        stats = await self.store.queue_stats(TIMER_QUEUE_ID)
        return [
            max(0, stats.partitions[level].max_offset - self._floor(level))
            for level in range(len(self.levels_ms))
        ]

    @property
    def in_memory(self) -> int:
        return len(self._heap)

    async def run(self) -> None:
        """The timer's only task: a pass, then sleep until the next ripe head or a notify."""
        away = ""  # the store error last logged
        while True:
            self._wakeup = anyio.Event()
            try:
                next_ms = await self.process()
                if self.clock() - self._last_commit >= COMMIT_INTERVAL_MS:
                    await self.commit()
            except StoreError as error:  # a broker away: one line, not a traceback a second
                if str(error) != away:
                    log.warning("timer pass failed: %s; retrying every %d ms", error, RETRY_MS)
                away = str(error)
                next_ms = self.clock() + RETRY_MS
            except Exception:
                log.exception("timer pass failed; retrying in %d ms", RETRY_MS)
                next_ms = self.clock() + RETRY_MS
            else:
                away = ""
            wait_s = IDLE_CHECK_S
            if next_ms is not None:
                wait_s = min(wait_s, max(0.0, (next_ms - self.clock()) / 1000))
            with anyio.move_on_after(wait_s):
                await self._wakeup.wait()

    # -- one pass ---------------------------------------------------------------------

    async def process(self) -> int | None:
        """Fire, park and hop everything ripe now; returns when the next pass is due (ms)."""
        now = self.clock()
        if self._retry and now < self._retry_at:
            return self._retry_at
        work, self._retry = self._retry, []
        heap = self._heap
        while heap and heap[0][0] < now:
            item = heapq.heappop(heap)[2]
            self._heap_bytes -= _size(item)
            work.append(item)
        reading = self._heap_bytes < HEAP_MAX_BYTES
        if reading:
            await self._read_ripe(now, work)
        if work:
            await self._handle(work, now)
        return self._next_wake(reading)

    async def _read_ripe(self, now: int, work: list[TimerItem]) -> None:
        stats = None
        for level in range(MAX_LEVELS):
            head = self._head_ripe[level]
            if head is None:
                if stats is None:
                    stats = await self.store.queue_stats(TIMER_QUEUE_ID)
                if stats.partitions[level].max_offset <= self._cursors[level]:
                    continue
            elif head > now:
                continue
            await self._read_level(level, now, work)

    async def _read_level(self, level: int, now: int, work: list[TimerItem]) -> None:
        delay = self._delays[level]
        cursor = self._cursors[level]
        # An unknown head is read alone first: a level of unripe records costs one record.
        count = 1 if self._head_ripe[level] is None else READ_BATCH
        budget = PASS_BUDGET
        self._head_ripe[level] = None
        while budget > 0:
            result = await self.store.read(TIMER_QUEUE_ID, level, cursor, count)
            if result.status is ReadStatus.MOVED:
                lost = result.min_offset - cursor
                self.dropped += lost
                log.error("timer level %d: %d record(s) deleted by retention unread", level, lost)
            if not result.messages:
                cursor = result.next_offset
                break
            for message in result.messages:
                ripe = message.store_ts_ms + delay
                if ripe > now:
                    self._head_ripe[level] = ripe
                    self._cursors[level] = cursor
                    return
                cursor = message.queue_offset + 1
                budget -= 1
                try:
                    item = decode_item(message, level)
                except (ValueError, UnicodeDecodeError, struct.error) as error:
                    self.dropped += 1
                    log.error("timer level %d offset %d dropped: %s", level, cursor - 1, error)
                    continue
                self._pending[level].add(item.offset)
                work.append(item)
            count = READ_BATCH
        if budget <= 0:
            self._head_ripe[level] = now  # more may be ripe: look again at once
        self._cursors[level] = cursor

    async def _handle(self, work: list[TimerItem], now: int) -> None:
        fire: dict[int, list[TimerItem]] = {}
        hops: list[TimerItem] = []
        work.sort(key=lambda item: item.due_ms)  # stable: ties keep arrival order
        for item in work:
            remaining = item.due_ms - now
            if remaining < 0:
                fire.setdefault(item.kind, []).append(item)
            elif remaining < self._min_step:
                heapq.heappush(self._heap, (item.due_ms, next(self._sequence), item))
                self._heap_bytes += _size(item)
            else:
                hops.append(item)
        retry: list[TimerItem] = []
        for kind, items in fire.items():
            retry += await self._fire(kind, items)
        if hops:
            since = now - HOP_SLACK_MS
            records = [item.record(self.level_for(item.due_ms - since)) for item in hops]
            try:
                await self.store.append(records)
            except StoreError as error:
                log.error("timer: %d hop(s) not stored, retrying: %s", len(hops), error)
                retry += hops
            else:
                self.hops += len(hops)
                self._hopped = True
                self._settle(hops)
        if retry:
            self._retry = retry
            self._retry_at = now + RETRY_MS

    async def _fire(self, kind: int, items: list[TimerItem]) -> list[TimerItem]:
        """Run the kind's handler on its items (due order); returns the items to retry."""
        handler = self._handlers.get(kind)
        if handler is None:
            self.dropped += len(items)
            log.error("timer: %d item(s) of unknown kind %d dropped", len(items), kind)
        else:
            try:
                await handler(items)
            except StoreError as error:
                log.error(
                    "timer: %d item(s) of kind %d not settled, retrying: %s",
                    len(items),
                    kind,
                    error,
                )
                return items
            except Exception:
                self.dropped += len(items)
                log.exception("timer: handler of kind %d failed; %d item(s)", kind, len(items))
            else:
                self.fired += len(items)
        self._settle(items)
        return []

    def _settle(self, items: list[TimerItem]) -> None:
        for item in items:
            self._pending[item.level].discard(item.offset)

    def _next_wake(self, reading: bool) -> int | None:
        if self._hopped and reading:
            self._hopped = False
            return 0  # a level that was empty may hold a hop now: read its head
        candidates = [h for h in self._head_ripe if h is not None] if reading else []
        if self._heap:
            candidates.append(self._heap[0][0] + 1)
        if self._retry:
            candidates.append(self._retry_at)
        return min(candidates) if candidates else None

    # -- offsets ----------------------------------------------------------------------

    def _floor(self, level: int) -> int:
        pending = self._pending[level]
        return min(pending) if pending else self._cursors[level]

    async def commit(self) -> None:
        """Write each level's lowest unsettled offset (the store persists it on its interval)."""
        self._last_commit = self.clock()
        for level in range(MAX_LEVELS):
            floor = self._floor(level)
            if floor != self._committed[level]:
                await self.store.commit_offset(QUEUE_GROUP, TIMER_QUEUE_ID, level, floor)
                self._committed[level] = floor


def _size(item: TimerItem) -> int:
    return len(item.message.body) + len(item.envelope) + 256
