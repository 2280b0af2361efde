"""The log timer over a real embedded store, driven by a fake clock shared by store and timer:
never early (every item fires at exactly due + 1 ms when driven pass by pass), ordered across
levels, hops to the largest level that fits, committed offset = lowest unsettled, a restart
reads unsettled items again, and unripe levels cost no memory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from gateway.features.log_timer import (
    DEFAULT_LEVELS_MS,
    TIMER_QUEUE_ID,
    LogTimer,
    TimerItem,
    TimerMessage,
    timer_record,
)
from storage import (
    QUEUE_GROUP,
    AppendResult,
    EmbeddedStore,
    FlushPolicy,
    ReadResult,
    Record,
    StoreConfig,
    StoreWriteError,
    open_embedded_store,
)
from tests.harness.clock import T0_MS, FakeClock

LEVELS = [0, 100, 1000, 5000]
T0 = T0_MS
KIND = 3
TARGET_QUEUE = 7


class Fired:
    """A fire handler: notes (time, body) and appends each item to TARGET_QUEUE."""

    def __init__(self, clock: FakeClock, store: EmbeddedStore) -> None:
        self.clock = clock
        self.store = store
        self.log: list[tuple[int, bytes]] = []

    async def __call__(self, items: list[TimerItem]) -> None:
        self.log.extend((self.clock.now_ms, item.message.body) for item in items)
        await self.store.append(
            [Record(b"", b"", b"", item.message.body, ((TARGET_QUEUE, 0),)) for item in items]
        )


def message(body: bytes) -> TimerMessage:
    return TimerMessage("/", "x", b"x", b"key", b"\x00\x00", body)


@asynccontextmanager
async def timer_on(
    path: Path, clock: FakeClock, levels: Sequence[int] = LEVELS, store_type: type = EmbeddedStore
) -> AsyncIterator[tuple[LogTimer, Fired]]:
    config = StoreConfig(path, flush=FlushPolicy.ASYNC, segment_size_bytes=64 << 20)
    async with open_embedded_store(config, clock=clock) as opened:
        store = opened if store_type is EmbeddedStore else store_type(opened.log)
        await store.create_queue(TARGET_QUEUE, 1)
        timer = LogTimer(store, levels, clock=clock)
        fired = Fired(clock, store)
        timer.register(KIND, fired)
        await timer.start()
        yield timer, fired


async def schedule(timer: LogTimer, due_ms: int, body: bytes) -> None:
    await timer.add([timer.schedule(KIND, due_ms, message(body))])


async def drive(timer: LogTimer, clock: FakeClock, until_ms: int) -> None:
    """Run passes, moving the clock straight to each next wake-up the timer asks for."""
    for _ in range(10_000):
        wake = await timer.process()
        if wake is None or wake > until_ms:
            clock.now_ms = until_ms
            await timer.process()
            return
        clock.now_ms = max(clock.now_ms, wake)
    raise AssertionError("the timer never went idle")


async def level_counts(store: EmbeddedStore) -> list[int]:
    stats = await store.queue_stats(TIMER_QUEUE_ID)
    return [p.max_offset for p in stats.partitions]


@pytest.mark.anyio
async def test_items_fire_exactly_once_due_in_due_order_across_levels(tmp_path: Path) -> None:
    clock = FakeClock()
    delays = [0, 1, 50, 99, 100, 101, 950, 1000, 1234, 4999, 5000, 7777, 20_000]
    async with timer_on(tmp_path, clock) as (timer, fired):
        for delay in reversed(delays):
            await schedule(timer, T0 + delay, b"%d" % delay)
        await drive(timer, clock, T0 + 30_000)
        # Never early, never late: each fires on the first millisecond past its due time.
        assert fired.log == [(T0 + d + 1, b"%d" % d) for d in delays]
        target = await timer.store.read(TARGET_QUEUE, 0, 0, 100)
        assert [bytes(m.body) for m in target.messages] == [b"%d" % d for d in delays]
        assert timer.in_memory == 0
        assert await timer.pending_per_level() == [0] * len(LEVELS)


@pytest.mark.anyio
async def test_a_due_time_already_past_fires_at_once(tmp_path: Path) -> None:
    clock = FakeClock()
    async with timer_on(tmp_path, clock) as (timer, fired):
        await schedule(timer, T0 - 5000, b"late")
        clock.now_ms += 1
        await timer.process()
        assert fired.log == [(T0 + 1, b"late")]


@pytest.mark.anyio
async def test_hops_take_the_largest_level_that_fits(tmp_path: Path) -> None:
    clock = FakeClock()
    async with timer_on(tmp_path, clock) as (timer, fired):
        await schedule(timer, T0 + 2350, b"m")
        assert await level_counts(timer.store) == [0, 0, 1, 0] + [0] * 28
        await drive(timer, clock, T0 + 3000)
        # 2350 -> level 1000; at +1000: 1350 left -> 1000; at +2000: 350 -> 100 (x3); 50 -> heap
        assert await level_counts(timer.store) == [0, 3, 2, 0] + [0] * 28
        assert timer.hops == 4
        assert fired.log == [(T0 + 2351, b"m")]


@pytest.mark.anyio
async def test_a_late_read_hop_keeps_its_level_instead_of_cascading(tmp_path: Path) -> None:
    clock = FakeClock()
    async with timer_on(tmp_path, clock) as (timer, fired):
        await schedule(timer, T0 + 2000, b"m")
        clock.now_ms = T0 + 1004  # the timer gets to the ripe head 4 ms late
        await timer.process()
        assert await level_counts(timer.store) == [0, 0, 2, 0] + [0] * 28  # one hop, to 1000
        await drive(timer, clock, T0 + 3000)
        assert fired.log == [(T0 + 2004, b"m")]  # late by the read lag only, never early
        assert timer.hops == 1


@pytest.mark.anyio
async def test_a_delay_of_exactly_one_level_lands_on_it(tmp_path: Path) -> None:
    clock = FakeClock()
    async with timer_on(tmp_path, clock) as (timer, fired):
        clock.now_ms = T0 + 3  # scheduling happens a little after the publish
        await timer.add([timer.schedule(KIND, T0 + 1000, message(b"m"), now_ms=T0)])
        assert await level_counts(timer.store) == [0, 0, 1, 0] + [0] * 28
        await drive(timer, clock, T0 + 2000)
        assert fired.log == [(T0 + 1003, b"m")]  # ripe at store time + 1000 ms


def test_levels_follow_the_ladder_and_stay_under_the_retention_cap() -> None:
    timer = LogTimer(None, clock=lambda: 0)  # type: ignore[arg-type]
    assert timer.levels_ms[1:19] == [
        1000, 5000, 10_000, 30_000, *(60_000 * m for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20, 30)),
        3_600_000, 7_200_000,
    ]  # fmt: skip
    assert timer.level_for(0) == 0
    assert timer.level_for(999) == 0
    assert timer.level_for(1000) == 1
    assert timer.level_for(7_199_999) == 17
    assert timer.level_for(10**12) == len(DEFAULT_LEVELS_MS) - 1
    capped = LogTimer(None, clock=lambda: 0, max_level_ms=36 * 3_600_000)  # type: ignore[arg-type]
    assert DEFAULT_LEVELS_MS[capped.level_for(10**12)] == 32 * 3_600_000
    with pytest.raises(ValueError, match="start at 0"):
        LogTimer(None, [100, 200])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="increase"):
        LogTimer(None, [0, 200, 100])  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_schedule_at_level_is_due_after_that_level(tmp_path: Path) -> None:
    clock = FakeClock()
    async with timer_on(tmp_path, clock) as (timer, fired):
        await timer.add([timer.schedule_at_level(KIND, 2, message(b"retry"), attempt=2)])
        assert await level_counts(timer.store) == [0, 0, 1, 0] + [0] * 28
        await drive(timer, clock, T0 + 2000)
        assert fired.log == [(T0 + 1001, b"retry")]
        assert timer.hops == 0


@pytest.mark.anyio
async def test_committed_offset_is_the_lowest_unsettled_item(tmp_path: Path) -> None:
    clock = FakeClock()
    async with timer_on(tmp_path, clock) as (timer, fired):
        for delay in (90, 10, 50):  # all level 0, waiting in the heap
            await schedule(timer, T0 + delay, b"%d" % delay)
        store = timer.store

        async def committed() -> int:
            await timer.commit()
            return await store.committed_offset(QUEUE_GROUP, TIMER_QUEUE_ID, 0)

        await timer.process()
        assert timer.in_memory == 3
        assert await committed() == 0
        await drive(timer, clock, T0 + 60)  # 10 and 50 fired; 90 (offset 0) still waits
        assert [body for _, body in fired.log] == [b"10", b"50"]
        assert await committed() == 0
        assert await timer.pending_per_level() == [3, 0, 0, 0]
        await drive(timer, clock, T0 + 100)
        assert await committed() == 3
        assert await timer.pending_per_level() == [0, 0, 0, 0]


@pytest.mark.anyio
async def test_a_restart_reads_unsettled_items_again_and_settled_ones_never(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    async with timer_on(tmp_path, clock) as (timer, fired):
        await schedule(timer, T0 + 20, b"early")
        await schedule(timer, T0 + 450, b"in-heap")  # hops on level 100 until 50 ms are left
        await schedule(timer, T0 + 3000, b"on-disk")
        await drive(timer, clock, T0 + 420)
        assert fired.log == [(T0 + 21, b"early")]
        assert timer.in_memory == 1
        await timer.commit()
    # The process stops here; the heap is gone with it. A new timer resumes from the store.
    async with timer_on(tmp_path, clock) as (timer, fired):
        await drive(timer, clock, T0 + 10_000)
        assert fired.log == [(T0 + 451, b"in-heap"), (T0 + 3001, b"on-disk")]


@pytest.mark.anyio
async def test_without_a_commit_everything_is_read_again(tmp_path: Path) -> None:
    clock = FakeClock()
    async with timer_on(tmp_path, clock) as (timer, fired):
        await schedule(timer, T0 + 20, b"a")
        await drive(timer, clock, T0 + 30)
        assert fired.log == [(T0 + 21, b"a")]
    async with timer_on(tmp_path, clock) as (timer, fired):
        await timer.process()
        assert fired.log == [(T0 + 30, b"a")]  # at-least-once: fired twice, never lost


@pytest.mark.anyio
async def test_an_unripe_level_costs_one_record_read_not_memory(tmp_path: Path) -> None:
    reads: list[int] = []

    class CountingStore(EmbeddedStore):
        async def read(
            self,
            queue_id: int,
            partition: int,
            offset: int,
            max_count: int = 256,
            max_bytes: int = 4 << 20,
        ) -> ReadResult:
            result = await super().read(queue_id, partition, offset, max_count, max_bytes)
            reads.append(len(result.messages))
            return result

    clock = FakeClock()
    async with timer_on(tmp_path, clock, store_type=CountingStore) as (timer, fired):
        for i in range(5000):
            await timer.store.append([timer.schedule(KIND, T0 + 6000 + i, message(b"x" * 100))])
            if i % 500 == 0:
                clock.now_ms += 1
                await timer.process()
        for _ in range(20):
            await timer.process()
        assert sum(reads) == 1
        assert timer.in_memory == 0
        assert await timer.pending_per_level() == [0, 0, 0, 5000]
        assert fired.log == []


@pytest.mark.anyio
async def test_a_failed_append_leaves_items_unsettled_and_retries(tmp_path: Path) -> None:
    failures = [1]

    class FlakyStore(EmbeddedStore):
        async def append(
            self, records: Sequence[Record], wait_durable: bool = True
        ) -> AppendResult:
            if failures and all(r.destinations == ((TARGET_QUEUE, 0),) for r in records):
                failures.pop()
                raise StoreWriteError("disk on fire")
            return await super().append(records, wait_durable)

    clock = FakeClock()
    async with timer_on(tmp_path, clock, store_type=FlakyStore) as (timer, fired):
        await schedule(timer, T0 + 10, b"m")
        await drive(timer, clock, T0 + 5000)
        target = await timer.store.read(TARGET_QUEUE, 0, 0, 10)
        assert [bytes(m.body) for m in target.messages] == [b"m"]
        assert fired.log[0] == (T0 + 11, b"m")  # the failed attempt
        assert fired.log[1][0] >= T0 + 11 + 1000  # retried after the back-off
        await timer.commit()
        assert await timer.store.committed_offset(QUEUE_GROUP, TIMER_QUEUE_ID, 0) == 1


@pytest.mark.anyio
async def test_bad_records_and_unknown_kinds_are_dropped_and_counted(tmp_path: Path) -> None:
    clock = FakeClock()
    async with timer_on(tmp_path, clock) as (timer, fired):
        garbage = Record(b"", b"", b"\x09not-an-envelope-at-all", b"", ((TIMER_QUEUE_ID, 0),))
        stranger = timer_record(99, T0 + 1, 0, message(b"who"))
        await timer.add([garbage, stranger])
        await schedule(timer, T0 + 1, b"known")
        await drive(timer, clock, T0 + 10)
        assert [body for _, body in fired.log] == [b"known"]
        assert timer.dropped == 2
        await timer.commit()
        assert await timer.store.committed_offset(QUEUE_GROUP, TIMER_QUEUE_ID, 0) == 3


@pytest.mark.anyio
async def test_levels_from_a_longer_configuration_still_drain(tmp_path: Path) -> None:
    clock = FakeClock()
    async with timer_on(tmp_path, clock) as (timer, fired):
        await schedule(timer, T0 + 6000, b"deep")
        assert (await level_counts(timer.store))[3] == 1
    async with timer_on(tmp_path, clock, levels=[0, 100]) as (timer, fired):
        await drive(timer, clock, T0 + 10_000)
        assert fired.log == [(T0 + 6001, b"deep")]


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.anyio
async def test_the_timer_task_wakes_for_a_new_item_and_fires_it(tmp_path: Path) -> None:
    config = StoreConfig(tmp_path, flush=FlushPolicy.ASYNC, segment_size_bytes=64 << 20)
    async with open_embedded_store(config) as store:
        timer = LogTimer(store)
        done = anyio.Event()
        seen: list[tuple[int, int]] = []

        async def handler(items: list[TimerItem]) -> None:
            seen.extend((timer.clock(), item.due_ms) for item in items)
            done.set()

        timer.register(KIND, handler)
        await timer.start()
        async with anyio.create_task_group() as tg:
            tg.start_soon(timer.run)
            due = timer.clock() + 30
            await timer.add([timer.schedule(KIND, due, message(b"soon"))])
            with anyio.fail_after(5):
                await done.wait()
            tg.cancel_scope.cancel()
        assert len(seen) == 1
        fired_at, due_ms = seen[0]
        assert due_ms == due
        assert fired_at > due
