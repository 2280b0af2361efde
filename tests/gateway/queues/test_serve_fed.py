"""A queue fed from the publisher's batch (write-through) is served at once, in the
publisher's task, without reading the store back; queues with timers, and queues already
waiting in the ready set, take their scheduler turn as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from gateway.queues.runtime import QueueRuntime
from gateway.queues.scheduler import PushScheduler
from gateway.vhost import VirtualHost
from meta.local_store import LocalMetadataStore
from meta.models import QueueDef
from storage import EmbeddedStore, ReadResult, Record, open_embedded_store
from tests.gateway.queues.test_push_scheduler import _config, _consume
from tests.harness.stub_session import StubSession


class Reads:
    """Counts the store reads of one queue."""

    def __init__(self, store: EmbeddedStore, queue_id: int) -> None:
        self.count = 0
        self._read = store.read
        self.queue_id = queue_id
        store.read = self.read  # type: ignore[method-assign]

    async def read(self, queue_id: int, *args: Any, **kwargs: Any) -> ReadResult:
        if queue_id == self.queue_id:
            self.count += 1
        return await self._read(queue_id, *args, **kwargs)


async def _vhost(store: EmbeddedStore, tmp_path: Path, scheduler: PushScheduler) -> VirtualHost:
    vhost = VirtualHost("/", LocalMetadataStore(tmp_path / "meta"), store, scheduler, 1)
    await vhost.load()
    return vhost


async def _publish(vhost: VirtualHost, queue: QueueRuntime, bodies: list[bytes]) -> None:
    """What Session.publish_batch does with a routed batch."""
    records = [Record(b"", queue.name.encode(), b"", b, ((queue.queue_id, 0),)) for b in bodies]
    for record in records:
        queue.count_in(len(record.body))
    result = await vhost.store.append(records, wait_durable=False)
    await vhost.stored({queue}, records, result)


async def _caught_up(vhost: VirtualHost, name: str, **arguments: Any) -> QueueRuntime:
    queue = await vhost.declare_queue(
        QueueDef(vhost="/", name=name, arguments=arguments), False, "c"
    )
    while await vhost.scheduler.turn():  # the turn its declaration gave it
        pass
    await queue.fill()  # has read everything there is: caught up
    return queue


def test_a_fed_queue_delivers_in_the_publishers_task_without_a_read(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with open_embedded_store(_config(tmp_path / "store")) as store:
            scheduler = PushScheduler(quota=64)
            vhost = await _vhost(store, tmp_path, scheduler)
            queue = await _caught_up(vhost, "fed")
            session = StubSession()
            consumer = _consume(session, queue, no_ack=False, prefetch=2)
            reads = Reads(store, queue.queue_id)
            await _publish(vhost, queue, [b"m0", b"m1", b"m2"])
            assert [b for _, b, _ in session.deliveries] == [b"m0", b"m1"]  # as far as credit goes
            assert scheduler.ready_count == 0 and reads.count == 0
            # An ack returns credit: the turn it gives delivers the rest, still without a read.
            (delivery,) = consumer.channel.pop_deliveries(1, False)
            queue.settle(delivery.partition, delivery.message)
            consumer.unacked -= 1
            scheduler.wake(queue)
            assert await scheduler.turn()
            assert [b for _, b, _ in session.deliveries] == [b"m0", b"m1", b"m2"]
            assert reads.count == 0
            # Messages stored while the queue was not caught up are read as before.
            consumer.unacked = 0
            queue.exhausted = False  # as after a publish it could not take from the batch
            await store.append([Record(b"", b"", b"", b"m3", ((queue.queue_id, 0),))])
            queue.count_in(2)
            scheduler.wake_new_messages(queue)
            while await scheduler.turn():
                pass
            assert [b for _, b, _ in session.deliveries][-1] == b"m3"
            assert reads.count >= 1
            assert queue.ready_count == 0

    anyio.run(scenario)


def test_queues_with_timers_or_already_ready_take_their_turn(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with open_embedded_store(_config(tmp_path / "store")) as store:
            scheduler = PushScheduler(quota=64)
            vhost = await _vhost(store, tmp_path, scheduler)
            ttl = await _caught_up(vhost, "ttl", **{"x-message-ttl": 60_000})
            ready = await _caught_up(vhost, "ready")
            session = StubSession()
            for queue in (ttl, ready):
                _consume(session, queue)
            scheduler.wake(ready)  # in the ready set already: it keeps its place
            await _publish(vhost, ttl, [b"t0"])
            await _publish(vhost, ready, [b"r0"])
            assert session.deliveries == []
            assert scheduler.ready_count == 2
            while await scheduler.turn():
                pass
            assert sorted(session.from_queues()) == [("ready", b"r0"), ("ttl", b"t0")]

    anyio.run(scenario)
