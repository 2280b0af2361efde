"""x-max-length-bytes with reject-publish, counted by the broker (storage/broker/limits.py):
a destination is refused when its body would take the queue's bytes after the committed
offset past the limit, and the running sums that count those bytes follow every append
without reading it back, and rebuild themselves when they fall out of step."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from storage import (
    QUEUE_GROUP,
    DeliveryProgress,
    EmbeddedStore,
    Record,
    StoreConfig,
    open_embedded_store,
)
from storage.broker.limits import TRIM_ENTRIES, ReadyBytes, refuse_over_limits

pytestmark = [
    pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"]),
    pytest.mark.anyio,
]


def rec(size: int, *dests: tuple[int, int]) -> Record:
    return Record(b"", b"k", b"", b"x" * size, tuple(dests), born_ts_ms=1, flags=0)


@asynccontextmanager
async def opened(tmp_path: Path, *queues: tuple[int, int]) -> AsyncIterator[EmbeddedStore]:
    async with open_embedded_store(StoreConfig(tmp_path / "store")) as store:
        for queue_id, partitions in queues:
            await store.create_queue(queue_id, partitions)
        yield store


class Broker:
    """What storage/broker/server.py does with an APPEND: refuse, append what is kept, and let the
    sums take the kept records."""

    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store
        self.ready_bytes = ReadyBytes(store)

    async def append(
        self,
        records: Sequence[Record],
        limits: Sequence[tuple[int, int]] = (),
        byte_limits: Sequence[tuple[int, int]] = (),
    ) -> list[tuple[int, int, int]]:
        kept, refused = await refuse_over_limits(
            self.store, records, limits, byte_limits, self.ready_bytes
        )
        result = await self.store.append(kept)
        self.ready_bytes.appended(kept, result.queue_starts)
        return refused


async def bytes_after_committed(store: EmbeddedStore, queue_id: int) -> int:
    """The same count the slow way: read every ready message back."""
    total = 0
    for stats in (await store.queue_stats(queue_id)).partitions:
        offset = stats.committed
        while offset < stats.max_offset:
            page = await store.read(queue_id, stats.partition, offset, 1000)
            total += sum(len(m.body) for m in page.messages)
            offset = page.next_offset
    return total


async def test_a_body_that_would_pass_the_limit_is_refused(tmp_path: Path) -> None:
    async with opened(tmp_path, (1, 1)) as store:
        broker = Broker(store)
        limit = [(1, 100)]
        assert await broker.append([rec(40, (1, 0)), rec(40, (1, 0))], byte_limits=limit) == []
        # 80 + 30 > 100: refused; 80 + 20 == 100: taken (RabbitMQ: "would exceed").
        refused = await broker.append([rec(30, (1, 0)), rec(20, (1, 0))], byte_limits=limit)
        assert refused == [(0, 1, 0)]
        assert await broker.append([rec(1, (1, 0)), rec(0, (1, 0))], byte_limits=limit) == [
            (0, 1, 0)
        ]  # full to the byte: an empty body still fits
        assert await bytes_after_committed(store, 1) == 100
        assert (await store.queue_stats(1)).partitions[0].max_offset == 4


async def test_room_comes_back_as_the_committed_offset_moves(tmp_path: Path) -> None:
    async with opened(tmp_path, (1, 1)) as store:
        broker = Broker(store)
        limit = [(1, 100)]
        await broker.append([rec(50, (1, 0)), rec(30, (1, 0)), rec(20, (1, 0))], byte_limits=limit)
        assert await broker.append([rec(1, (1, 0))], byte_limits=limit) == [(0, 1, 0)]
        await store.commit_offset(QUEUE_GROUP, 1, 0, 1)  # the 50 acknowledged
        refused = await broker.append([rec(50, (1, 0)), rec(1, (1, 0))], byte_limits=limit)
        assert refused == [(1, 1, 0)]
        await store.commit_offset(QUEUE_GROUP, 1, 0, 0)  # an offset reset: the 50 is back
        assert await broker.append([rec(0, (1, 0))], byte_limits=limit) == [(0, 1, 0)]
        assert await broker.ready_bytes.count(1, (await store.queue_stats(1)).partitions) == 150


async def test_both_limits_and_a_fan_out_refused_in_part(tmp_path: Path) -> None:
    async with opened(tmp_path, (1, 1), (2, 1), (3, 1)) as store:
        broker = Broker(store)
        limits, byte_limits = [(2, 2), (1, 3)], [(1, 100)]
        fan = ((1, 0), (2, 0), (3, 0))
        batch = [rec(60, *fan), rec(30, *fan), rec(20, *fan), rec(5, *fan)]
        refused = await broker.append(batch, limits, byte_limits)
        # queue 1: 60 + 30 fit, + 20 would pass 100, + 5 fits (95); queue 2 takes two.
        assert refused == [(2, 1, 0), (2, 2, 0), (3, 2, 0)]
        assert await bytes_after_committed(store, 1) == 95
        assert await bytes_after_committed(store, 2) == 90
        assert await bytes_after_committed(store, 3) == 115  # unlimited: everything
        # queue 1 is at 3 messages: its count limit refuses even a body that fits.
        assert await broker.append([rec(1, (1, 0))], limits, byte_limits) == [(0, 1, 0)]


async def test_the_sums_follow_appends_without_reading_them_back(tmp_path: Path) -> None:
    async with opened(tmp_path, (1, 2)) as store:
        broker = Broker(store)
        await store.append([rec(7, (1, 0)), rec(9, (1, 1))])  # before any limit: read once
        limit = [(1, 1 << 40)]
        rng = random.Random(5)
        for _ in range(500):  # past TRIM_ENTRIES per partition
            await broker.append(
                [rec(rng.randrange(50), (1, rng.randrange(2))) for _ in range(20)],
                byte_limits=limit,
            )
        assert broker.ready_bytes.entries_read == 2  # the two from before, nothing since
        stats = (await store.queue_stats(1)).partitions
        assert await broker.ready_bytes.count(1, stats) == await bytes_after_committed(store, 1)
        # Consumed, the sums forget what lies below the committed offset.
        for part in stats:
            await store.commit_offset(QUEUE_GROUP, 1, part.partition, part.max_offset - 10)
        for _ in range(3):
            await broker.append([rec(3, (1, 0))], byte_limits=limit)
        assert broker.ready_bytes.entries_read == 2
        sizes = [len(sums.sums) for sums in broker.ready_bytes._parts.values()]
        assert max(sizes) <= TRIM_ENTRIES + 12, sizes


async def test_sums_out_of_step_are_read_again(tmp_path: Path) -> None:
    async with opened(tmp_path, (1, 1)) as store:
        broker = Broker(store)
        limit = [(1, 1000)]
        await broker.append([rec(100, (1, 0))] * 3, byte_limits=limit)
        assert broker.ready_bytes.entries_read == 0  # empty when first counted
        await store.append([rec(200, (1, 0))] * 2)  # an append the sums never saw
        assert await broker.append([rec(301, (1, 0)), rec(300, (1, 0))], byte_limits=limit) == [
            (0, 1, 0)
        ]
        assert broker.ready_bytes.entries_read == 2  # only the two it missed
        # Deleted and declared again under the same id: counted from nothing.
        await store.delete_queue(1)
        broker.ready_bytes.forget(1)
        await store.create_queue(1, 1)
        assert await broker.append([rec(1000, (1, 0))], byte_limits=limit) == []
        # Again, the sums not told: the appends that follow find them out of step.
        await store.delete_queue(1)
        await store.create_queue(1, 1)
        await broker.append([rec(100, (1, 0))] * 8)  # a gateway without the limit
        assert await broker.append([rec(201, (1, 0)), rec(200, (1, 0))], byte_limits=limit) == [
            (0, 1, 0)
        ]


async def test_a_new_era_starts_the_sums_anew(tmp_path: Path) -> None:
    async with opened(tmp_path, (1, 1)) as store:
        era = [1]
        sums = ReadyBytes(store, lambda: era[0])
        await store.append([rec(10, (1, 0))] * 4)
        assert await sums.count(1, (await store.queue_stats(1)).partitions) == 40
        assert sums.entries_read == 4
        era[0] = 2  # a replicated broker's new role epoch: its log may have been rewritten
        assert await sums.count(1, (await store.queue_stats(1)).partitions) == 40
        assert sums.entries_read == 8


async def test_a_random_history_counts_like_reading_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends (checked, unchecked, or unseen by the sums), commits forward and back,
    purges, deletes (the broker forgetting the queue or not): after each step the broker's
    count equals the bytes read back. Small trim and idle thresholds, so both happen."""
    monkeypatch.setattr("storage.broker.limits.TRIM_ENTRIES", 8)
    monkeypatch.setattr("storage.broker.limits.IDLE_APPENDS", 6)
    async with opened(tmp_path, (1, 3)) as store:
        broker = Broker(store)
        rng = random.Random(11)
        limit = [(1, 1 << 40)]
        for step in range(600):
            action = rng.random()
            batch = [rec(rng.randrange(100), (1, rng.randrange(3))) for _ in range(5)]
            if action < 0.45:
                await broker.append(batch, byte_limits=limit)
            elif action < 0.55:
                await broker.append(batch)  # a gateway that does not know the limit
            elif action < 0.6:
                await store.append(batch)  # an append the sums never see
            elif action < 0.9:
                stats = (await store.queue_stats(1)).partitions[rng.randrange(3)]
                offset = rng.randint(stats.min_offset, stats.max_offset)
                await store.commit_offset(QUEUE_GROUP, 1, stats.partition, offset)
            elif action < 0.97:
                await store.purge(1)
            else:
                await store.delete_queue(1)
                if rng.random() < 0.5:
                    broker.ready_bytes.forget(1)
                await store.create_queue(1, 3)
            if rng.random() < 0.5:
                continue  # not every step counts (pushes pile up, sums fall idle)
            stats_now = (await store.queue_stats(1)).partitions
            counted = await broker.ready_bytes.count(1, stats_now)
            assert counted == await bytes_after_committed(store, 1), step


async def test_max_length_counts_ready_only_once_the_delivering_gateway_reports(
    tmp_path: Path,
) -> None:
    """Delivered but unacknowledged messages are not ready: with a progress report the broker
    counts as RabbitMQ does; without one it cannot tell them apart and counts them."""
    async with opened(tmp_path, (1, 1)) as store:
        broker = Broker(store)
        assert await broker.append([rec(1, (1, 0)) for _ in range(10)]) == []
        await store.commit_offset(QUEUE_GROUP, 1, 0, 2)  # 2 acked, 8 after the committed offset
        refused = await broker.append([rec(1, (1, 0)) for _ in range(3)], limits=[(1, 10)])
        assert [index for index, _, _ in refused] == [2]  # 8 + 2 = 10: the third would pass
        # The holder reports: offsets 2..7 handed out, one of them requeued: 12 - 8 + 1 ready.
        await store.commit_offset(QUEUE_GROUP, 1, 0, 2, 0, DeliveryProgress(8, 1, 1))
        refused = await broker.append([rec(1, (1, 0)) for _ in range(7)], limits=[(1, 10)])
        assert [index for index, _, _ in refused] == [5, 6]  # 5 + 5 = 10
