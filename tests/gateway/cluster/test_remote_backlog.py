"""RemoteBacklog, the publishing side of flow control across gateways, over a stub store and
a hand-driven clock: when it holds, when a stale report holds nobody, one read per queue."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import anyio
import pytest

from gateway.cluster.backlog import (
    MOVING_WINDOW_S,
    SAMPLE_KEEP_S,
    SAMPLE_TTL_S,
    SAMPLES_KEPT,
    RemoteBacklog,
)
from gateway.queues.intake import FLOW_HIGH, FLOW_LOW
from gateway.queues.runtime import QueueRuntime
from storage import PartitionStats, QueueStats
from tests.harness.clock import FakeClock

pytestmark = pytest.mark.anyio


class StubStore:
    """queue_stats answers from ``reports``: (next offset, takers, ready it meant) or None."""

    def __init__(self) -> None:
        self.report: tuple[int, int, int] | None = None
        self.calls = 0
        self.gate: anyio.Event | None = None

    async def queue_stats(self, queue_id: int, group: str = "$queue") -> QueueStats:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.report is None:
            part = PartitionStats(0, 0, 50_000, 0, 0)
        else:
            offset, takers, ready = self.report
            part = PartitionStats(0, 0, 50_000, 0, 0, offset, 0, takers, ready)
        return QueueStats(queue_id, [part], part.ready, 0)


QUEUE = cast(QueueRuntime, SimpleNamespace(queue_id=7, enqueued=0))


def backlog() -> tuple[RemoteBacklog, StubStore, FakeClock]:
    store, clock = StubStore(), FakeClock()
    return RemoteBacklog(cast(Any, store), clock.monotonic), store, clock


async def sample_at(
    remote: RemoteBacklog, clock: FakeClock, step_s: float = 2 * SAMPLE_TTL_S
) -> Any:
    clock.advance(step_s)
    return await remote.sample(QUEUE)


async def test_held_only_while_far_behind_with_takers_and_moving() -> None:
    remote, store, clock = backlog()
    assert not remote.congested(await remote.sample(QUEUE))  # no report: nobody delivers
    store.report = (1_000, 2, FLOW_HIGH + 1)
    first = await sample_at(remote, clock)
    assert not remote.congested(first)  # one report: not seen moving yet
    store.report = (1_100, 2, FLOW_HIGH + 1)
    assert remote.congested(await sample_at(remote, clock))
    store.report = (1_200, 0, FLOW_HIGH + 1)  # its consumers have no credit: waiting won't help
    assert not remote.congested(await sample_at(remote, clock))
    store.report = (1_300, 2, FLOW_HIGH)  # not above the mark
    assert not remote.congested(await sample_at(remote, clock))
    store.report = (1_400, 2, FLOW_HIGH + 1)
    assert remote.congested(await sample_at(remote, clock))
    # The delivering gateway went quiet: the report stops moving and soon holds nobody.
    assert remote.congested(await sample_at(remote, clock, MOVING_WINDOW_S / 2))
    assert not remote.congested(await sample_at(remote, clock, MOVING_WINDOW_S))


async def test_samples_are_cached_and_one_read_serves_every_waiter() -> None:
    remote, store, clock = backlog()
    store.report = (5, 1, 10)
    await remote.sample(QUEUE)
    await remote.sample(QUEUE)
    assert store.calls == 1  # within SAMPLE_TTL_S
    clock.advance(2 * SAMPLE_TTL_S)
    store.gate = anyio.Event()
    results: list[Any] = []

    async def waiter() -> None:
        results.append(await remote.sample(QUEUE))

    async with anyio.create_task_group() as tg:
        for _ in range(5):
            tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        store.gate.set()
    assert store.calls == 2 and len(results) == 5


async def test_hold_waits_until_the_backlog_is_low_and_never_past_its_bound() -> None:
    store = StubStore()
    remote = RemoteBacklog(cast(Any, store))  # the real clock: hold polls in real time
    store.report = (0, 1, FLOW_HIGH + 500)
    await remote.sample(QUEUE)
    await anyio.sleep(SAMPLE_TTL_S)
    store.report = (100, 1, FLOW_HIGH + 500)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:

            async def drain() -> None:
                await anyio.sleep(0.2)
                store.report = (200, 1, FLOW_LOW)

            tg.start_soon(drain)
            assert await remote.hold(QUEUE, max_wait_s=3)
    assert store.report == (200, 1, FLOW_LOW)
    # Still far behind and moving: the wait ends at its bound all the same.
    store.report = (300, 1, FLOW_HIGH + 500)
    await anyio.sleep(SAMPLE_TTL_S)
    before = anyio.current_time()
    assert await remote.hold(QUEUE, max_wait_s=0.2)
    assert 0.2 <= anyio.current_time() - before < 2


async def test_samples_of_queues_no_longer_published_to_are_let_go() -> None:
    remote, store, clock = backlog()
    store.report = (5, 1, 10)
    for queue_id in range(SAMPLES_KEPT):
        await remote.sample(cast(QueueRuntime, SimpleNamespace(queue_id=queue_id, enqueued=0)))
    clock.advance(SAMPLE_KEEP_S + 1)
    newest = cast(QueueRuntime, SimpleNamespace(queue_id=SAMPLES_KEPT, enqueued=0))
    await remote.sample(newest)  # one more than kept: the ones unread for long go
    assert list(remote._samples) == [SAMPLES_KEPT]
