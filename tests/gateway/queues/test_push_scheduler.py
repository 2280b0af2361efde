"""The push scheduler with a real store and real queue runtimes (the session is a stub):
fairness, prefetch exactness, pause, rate limits, and a task count that does not grow."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import anyio
import pytest

from gateway.queues.intake import FLOW_HIGH, FLOW_LOW
from gateway.queues.rate_limit import TokenBucket
from gateway.queues.runtime import QueueRuntime
from gateway.queues.scheduler import PushScheduler
from gateway.sessions.channel_state import ChannelState, Consumer
from meta.models import QueueDef
from storage import EmbeddedStore, FlushPolicy, Record, StoreConfig, open_embedded_store
from tests.harness.clock import FakeClock
from tests.harness.stub_session import StubSession


def _config(tmp_path: Path) -> StoreConfig:
    return StoreConfig(
        tmp_path,
        flush=FlushPolicy.ASYNC,
        segment_size_bytes=64 << 20,
        cq_entries_per_segment=100_000,
    )


async def _queues(store: EmbeddedStore, count: int, first_id: int = 1) -> list[QueueRuntime]:
    runtimes = []
    for i in range(count):
        definition = QueueDef(vhost="/", name=f"q{first_id + i}", queue_id=first_id + i)
        await store.create_queue(definition.queue_id, 1)
        runtime = QueueRuntime(definition, store)
        await runtime.start()
        runtimes.append(runtime)
    return runtimes


async def _publish(store: EmbeddedStore, queue: QueueRuntime, count: int) -> None:
    for start in range(0, count, 4096):
        batch = [
            Record(b"", b"", b"", b"%d" % i, ((queue.queue_id, 0),))
            for i in range(start, min(count, start + 4096))
        ]
        await store.append(batch, wait_durable=False)


def _consume(
    session: StubSession,
    queue: QueueRuntime,
    channel: ChannelState | None = None,
    no_ack: bool = True,
    prefetch: int = 0,
    tag: str = "c",
) -> Consumer:
    channel = channel or ChannelState(1, session)  # type: ignore[arg-type]
    consumer = Consumer(tag, channel, queue, no_ack, False, 0, prefetch)
    channel.consumers[tag] = consumer
    queue.add_consumer(consumer)
    return consumer


def test_a_hot_backlog_does_not_starve_a_thousand_trickle_queues(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, int, int]:
        async with open_embedded_store(_config(tmp_path)) as store:
            hot, *trickle = await _queues(store, 1001)
            await _publish(store, hot, 1_000_000)
            await store.append(
                [Record(b"", b"", b"", b"t", ((q.queue_id, 0),)) for q in trickle],
                wait_durable=False,
            )
            session = StubSession()
            scheduler = PushScheduler(quota=64)
            for queue in (hot, *trickle):
                _consume(session, queue)
                scheduler.wake(queue)
            waiting = {q.name for q in trickle}
            turns = 0
            while waiting and turns < 10_000:
                seen = len(session.deliveries)
                await scheduler.turn()
                turns += 1
                waiting -= {name for name in session.queues[seen:] if name != "q1"}
            return turns, len(waiting), hot.delivered

    turns, left, hot_delivered = anyio.run(scenario)
    assert left == 0
    # Every trickle queue was served in the first round: one turn each, plus the hot queue's.
    assert turns <= 1001 + 2
    assert 0 < hot_delivered <= 64 * 3  # the hot queue got turns too, a quota at a time


def test_prefetch_holds_exactly_under_random_acks(tmp_path: Path) -> None:
    async def scenario() -> list[bytes]:
        async with open_embedded_store(_config(tmp_path)) as store:
            (queue,) = await _queues(store, 1)
            await _publish(store, queue, 400)
            session = StubSession()
            scheduler = PushScheduler(quota=16)
            shared = ChannelState(1, session)  # type: ignore[arg-type]
            shared.prefetch_global = 7  # channel-wide, as basic.qos(global=true)
            own = ChannelState(2, session)  # type: ignore[arg-type]
            consumers = [
                _consume(session, queue, shared, False, 0, "a1"),
                _consume(session, queue, shared, False, 3, "a2"),
                _consume(session, queue, own, False, 5, "b1"),
                _consume(session, queue, own, False, 2, "b2"),
            ]
            rng = random.Random(7)
            scheduler.wake(queue)
            for _ in range(5000):
                if rng.random() < 0.5:
                    await scheduler.turn()
                else:
                    channel = rng.choice([shared, own])
                    if channel.unacked:
                        tag = rng.choice(list(channel.unacked))
                        for delivery in channel.pop_deliveries(tag, rng.random() < 0.2):
                            queue.settle(delivery.partition, delivery.message)
                            assert delivery.consumer is not None
                            delivery.consumer.unacked -= 1
                        scheduler.wake(queue)
                for consumer in consumers:
                    assert consumer.prefetch == 0 or consumer.unacked <= consumer.prefetch
                    assert consumer.unacked == sum(
                        d.consumer is consumer for d in consumer.channel.unacked.values()
                    )
                assert len(shared.unacked) <= 7
            return [body for _, body, _ in session.deliveries]

    bodies = anyio.run(scenario)
    assert sorted(bodies, key=int) == [b"%d" % i for i in range(400)]  # each exactly once


def test_pause_stops_deliveries_within_one_turn_and_resume_restarts(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, int, int]:
        async with open_embedded_store(_config(tmp_path)) as store:
            (queue,) = await _queues(store, 1)
            await _publish(store, queue, 500)
            session = StubSession()
            scheduler = PushScheduler(quota=64)
            _consume(session, queue)
            scheduler.wake(queue)
            await scheduler.turn()
            before_pause = len(session.deliveries)
            queue.paused = True
            while await scheduler.turn():
                pass
            while_paused = len(session.deliveries) - before_pause
            queue.paused = False
            scheduler.wake(queue)
            while await scheduler.turn():
                pass
            return before_pause, while_paused, len(session.deliveries)

    assert anyio.run(scenario) == (64, 0, 500)


def test_rate_limit_holds_within_ten_percent(tmp_path: Path) -> None:
    async def scenario() -> list[int]:
        async with open_embedded_store(_config(tmp_path)) as store:
            (queue,) = await _queues(store, 1)
            await _publish(store, queue, 20_000)
            clock = FakeClock()
            session = StubSession()
            scheduler = PushScheduler(quota=64, clock=clock)
            _consume(session, queue)
            queue.rate_limit = TokenBucket(500, clock.monotonic())
            scheduler.wake(queue)
            per_second = []
            for _second in range(4):
                start = len(session.deliveries)
                for _ in range(100):  # 10 ms steps of simulated time
                    clock.advance(0.01)
                    scheduler.wake_due(clock.monotonic())
                    while await scheduler.turn():
                        pass
                per_second.append(len(session.deliveries) - start)
            return per_second

    for delivered in anyio.run(scenario):
        assert 450 <= delivered <= 550, delivered


@pytest.mark.parametrize("queues", [10_000])
def test_ten_thousand_queues_cost_no_tasks(tmp_path: Path, queues: int) -> None:
    async def scenario() -> tuple[int, int, int]:
        async with open_embedded_store(_config(tmp_path)) as store:
            runtimes = await _queues(store, queues)
            session = StubSession()
            scheduler = PushScheduler(tasks=3)
            async with anyio.create_task_group() as tg:
                tg.start_soon(scheduler.run)
                await anyio.wait_all_tasks_blocked()
                before = len(asyncio.all_tasks())
                for queue in runtimes:
                    _consume(session, queue)
                    scheduler.wake(queue)
                await store.append(
                    [Record(b"", b"", b"", b"m", ((q.queue_id, 0),)) for q in runtimes],
                    wait_durable=False,
                )
                for queue in runtimes:
                    scheduler.wake_new_messages(queue)
                with anyio.fail_after(60):
                    while len(session.deliveries) < queues:
                        await anyio.sleep(0.01)
                after = len(asyncio.all_tasks())
                tg.cancel_scope.cancel()
            return before, after, len(set(session.queues))

    before, after, served = anyio.run(scenario)
    assert served == queues
    assert after == before  # 3 push tasks + 1 timer, whatever the number of queues


def test_publishers_wait_while_a_consumable_queue_is_far_behind(tmp_path: Path) -> None:
    """Flow control: congested only while consumers with credit lag FLOW_HIGH messages;
    waiting publishers are released below FLOW_LOW, or at once when nobody has credit."""

    async def scenario() -> tuple[bool, bool, int, bool, bool]:
        async with open_embedded_store(_config(tmp_path)) as store:
            (queue,) = await _queues(store, 1)
            backlog = FLOW_HIGH + 100
            await _publish(store, queue, backlog)
            for _ in range(backlog):
                queue.count_in(1)
            session = StubSession()
            idle = queue.congested()  # no consumer: nobody is behind
            consumer = _consume(session, queue, no_ack=True)
            behind = queue.congested()
            released = queue.caught_up_signal()
            scheduler = PushScheduler(quota=64)
            scheduler.wake(queue)
            turns = 0
            while not released.is_set():
                await scheduler.turn()
                turns += 1
            ready_at_release = queue.ready_count
            # A consumer without credit (prefetch full): publishers are let go at once.
            consumer.no_ack, consumer.prefetch, consumer.unacked = False, 1, 1
            stuck = queue.caught_up_signal()
            scheduler.wake(queue)
            await scheduler.turn()
            return idle, behind, ready_at_release, stuck.is_set(), queue.congested()

    idle, behind, ready, stuck_released, still_congested = anyio.run(scenario)
    assert not idle and behind
    assert FLOW_LOW - 64 < ready <= FLOW_LOW
    assert stuck_released and not still_congested


def test_x_expires_and_ttl_follow_the_clock_passed_in(tmp_path: Path) -> None:
    """An hour of x-expires and a minute of TTL pass in no real time: the scheduler and the
    queue read only the clock they were given."""

    async def scenario() -> tuple[list[str], int, int]:
        clock = FakeClock()
        async with open_embedded_store(_config(tmp_path), clock=clock) as store:
            definition = QueueDef(
                vhost="/",
                name="idle",
                queue_id=1,
                arguments={"x-expires": 3_600_000, "x-message-ttl": 60_000},
            )
            await store.create_queue(1, 1)
            await store.append([Record(b"", b"", b"", b"m", ((1, 0),))], wait_durable=False)
            queue = QueueRuntime(definition, store, clock=clock)
            await queue.start()  # counts the message
            scheduler = PushScheduler(clock=clock)
            expired: list[str] = []

            async def on_unused(runtime: QueueRuntime) -> None:
                expired.append(runtime.name)

            scheduler.on_unused = on_unused
            scheduler.wake(queue)
            while await scheduler.turn():
                pass
            before = await queue.message_count()
            clock.advance(61)  # past the TTL: the message goes, the queue stays
            after_ttl = await queue.message_count()
            assert not expired
            clock.advance(3600)  # past x-expires
            scheduler.wake_due(clock.monotonic())
            while await scheduler.turn():
                pass
            return expired, before, after_ttl

    expired, before, after_ttl = anyio.run(scenario)
    assert (before, after_ttl) == (1, 0)
    assert expired == ["idle"]
