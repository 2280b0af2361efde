"""Single active consumer with a real store, the real push scheduler and stub sessions: who
gets the messages, who takes over, and that what the old one held goes out first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from gateway.features.queue_kinds import new_queue_runtime
from gateway.queues.runtime import QueueRuntime
from gateway.queues.scheduler import PushScheduler
from gateway.sessions.channel_state import ChannelState, Consumer
from meta.models import QueueDef
from storage import EmbeddedStore, FlushPolicy, Record, StoreConfig, open_embedded_store
from tests.harness.stub_session import StubSession


class Setup:
    def __init__(self, store: EmbeddedStore, queue: QueueRuntime, scheduler: PushScheduler):
        self.store = store
        self.queue = queue
        self.scheduler = scheduler
        self.session = StubSession()

    def consume(self, tag: str, priority: int = 0, prefetch: int = 0) -> Consumer:
        channel = ChannelState(len(self.queue.consumers) + 1, self.session)  # type: ignore[arg-type]
        consumer = Consumer(tag, channel, self.queue, False, False, priority, prefetch)
        channel.consumers[tag] = consumer
        self.queue.add_consumer(consumer)
        self.scheduler.wake(self.queue)
        return consumer

    def cancel(self, consumer: Consumer) -> None:
        """As the session does for basic.cancel or a closing channel (requeue after)."""
        consumer.channel.consumers.pop(consumer.tag)
        self.queue.remove_consumer(consumer)

    async def publish(self, *bodies: bytes) -> None:
        for body in bodies:
            self.queue.count_in(len(body))
        records = [Record(b"", b"q", b"", body, ((1, 0),)) for body in bodies]
        await self.store.append(records, wait_durable=False)
        self.scheduler.wake_new_messages(self.queue)

    async def run(self) -> list[tuple[str, bytes, bool]]:
        """Serve until nothing is ready; what was delivered meanwhile."""
        seen = len(self.session.deliveries)
        while await self.scheduler.turn():
            pass
        return self.session.deliveries[seen:]


def _run(tmp_path: Path, body: Any) -> None:
    async def scenario() -> None:
        config = StoreConfig(tmp_path, flush=FlushPolicy.ASYNC, cq_entries_per_segment=1000)
        async with open_embedded_store(config) as store:
            await store.create_queue(1, 1)
            scheduler = PushScheduler()
            arguments = {"x-single-active-consumer": True}
            definition = QueueDef(vhost="/", name="q", queue_id=1, arguments=arguments)
            queue = new_queue_runtime(definition, store, wake=scheduler.wake)
            await queue.start()
            await body(Setup(store, queue, scheduler))

    anyio.run(scenario)


def test_only_the_first_consumer_gets_messages_until_it_goes(tmp_path: Path) -> None:
    async def body(s: Setup) -> None:
        a = s.consume("a")
        s.consume("b")
        s.consume("c", priority=5)  # later and higher: no pre-emption in 3.10 classic queues
        await s.publish(b"1", b"2", b"3")
        assert await s.run() == [("a", b"1", False), ("a", b"2", False), ("a", b"3", False)]
        assert s.queue.active_consumer is a
        assert [s.queue.activity_status(c) for c in s.queue.consumers] == [
            "single_active",
            "waiting",
            "waiting",
        ]
        s.cancel(a)  # the highest priority waiting consumer takes over, woken by the queue
        # Its channel closes: what it held goes back (as Session.requeue_unacked does).
        for delivery in list(a.channel.unacked.values()):
            s.queue.requeue(delivery.partition, delivery.message)
        a.channel.unacked.clear()
        await s.publish(b"4")
        assert await s.run() == [
            ("c", b"1", True),
            ("c", b"2", True),
            ("c", b"3", True),
            ("c", b"4", False),
        ]

    _run(tmp_path, body)


def test_a_waiting_consumer_takes_over_by_priority_then_subscription(tmp_path: Path) -> None:
    async def body(s: Setup) -> None:
        a = s.consume("a")
        b = s.consume("b", priority=2)
        c = s.consume("c", priority=2)
        s.consume("d", priority=1)
        s.cancel(a)
        assert s.queue.active_consumer is b
        s.cancel(c)  # a waiting one leaves: nothing changes
        assert s.queue.active_consumer is b
        s.cancel(b)
        assert s.queue.active_consumer is not None
        assert s.queue.active_consumer.tag == "d"

    _run(tmp_path, body)


def test_messages_wait_for_the_active_consumer_when_it_has_no_credit(tmp_path: Path) -> None:
    async def body(s: Setup) -> None:
        a = s.consume("a", prefetch=1)
        s.consume("b")
        await s.publish(b"1", b"2", b"3")
        assert await s.run() == [("a", b"1", False)]  # b waits although it could take them
        assert s.queue.ready_count == 2
        (tag,) = a.channel.unacked
        delivery = a.channel.unacked.pop(tag)
        s.queue.settle(delivery.partition, delivery.message)
        a.unacked -= 1
        s.scheduler.wake(s.queue)
        assert await s.run() == [("a", b"2", False)]

    _run(tmp_path, body)


def test_the_new_active_consumer_is_served_without_a_publish(tmp_path: Path) -> None:
    """The active consumer leaves with messages waiting (it had no credit) and nothing it
    held to give back: the queue wakes itself for the next one."""

    async def body(s: Setup) -> None:
        a = s.consume("a")
        a.channel.flow_active = False  # channel.flow off: no credit
        s.consume("b")
        await s.publish(b"1", b"2")
        assert await s.run() == []
        s.cancel(a)
        assert await s.run() == [("b", b"1", False), ("b", b"2", False)]

    _run(tmp_path, body)
