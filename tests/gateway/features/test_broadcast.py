"""Broadcast subscriptions with a real store, the real scheduler and real channel bookkeeping
(the session is a stub that books deliveries as the real one does): every consumer gets every
message in order from its own position, settles and requeues stay per subscription, positions
start at the end, resume where committed, and survive a store reopen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from gateway.amqp.errors import AccessRefused
from gateway.features.broadcast import (
    Broadcasts,
    BroadcastSubscription,
    connection_name,
)
from gateway.queues.rate_limit import TokenBucket
from gateway.queues.runtime import PumpResult, QueueRuntime
from gateway.queues.scheduler import PushScheduler
from gateway.sessions.channel_state import ChannelState, Consumer
from meta.errors import PreconditionFailed as MetaPreconditionFailed
from meta.models import QueueDef
from meta.queue_arguments import check_queue_arguments
from storage import QUEUE_GROUP, EmbeddedStore, FlushPolicy, Record, StoreConfig
from storage import open_embedded_store as open_store
from tests.harness.stub_session import StubSession

PARTITIONS = 2


class Node:
    """The pieces of a node that broadcast consumption touches, over one queue."""

    def __init__(self, store: EmbeddedStore, queue: QueueRuntime) -> None:
        self.store = store
        self.queue = queue
        self.broadcasts = Broadcasts()
        self.scheduler = PushScheduler(quota=16)
        self.scheduler.redirect = self.broadcasts.wake_instead
        self.session = StubSession()
        self.channels = 0
        self.published = 0

    async def publish(self, count: int) -> None:
        """Bodies 0, 1, 2, ... spread over both partitions, then the publish wake-up."""
        records = [
            Record(b"", b"", b"", b"%d" % i, ((self.queue.queue_id, i % PARTITIONS),))
            for i in range(self.published, self.published + count)
        ]
        self.published += count
        await self.store.append(records, wait_durable=False)
        self.scheduler.wake_new_messages(self.queue)
        await self.run()

    async def consume(
        self, tag: str, prefetch: int = 0, no_ack: bool = False, persistent: bool = True
    ) -> Consumer:
        """basic.consume's path: the queue's new consumer reads its own subscription."""
        subscription = await self.broadcasts.subscribe(self.queue, f"b:{tag}", persistent)
        self.channels += 1
        channel = ChannelState(self.channels, self.session)  # type: ignore[arg-type]
        consumer = Consumer(tag, channel, subscription, no_ack, False, 0, prefetch)
        channel.consumers[tag] = consumer
        subscription.add_consumer(consumer)
        self.scheduler.wake(subscription)
        await self.run()
        return consumer

    async def run(self) -> None:
        while await self.scheduler.turn():
            pass

    async def settle(self, consumer: Consumer, count: int, requeue: bool = False) -> None:
        """Ack (or nack with requeue) the consumer's ``count`` oldest deliveries, as the
        session does: each goes back to the runtime the delivery came from."""
        channel = consumer.channel
        for tag in list(channel.unacked)[:count]:
            (delivery,) = channel.pop_deliveries(tag, False)
            if requeue:
                delivery.queue.requeue(delivery.partition, delivery.message)
            else:
                delivery.queue.settle(delivery.partition, delivery.message)
            consumer.unacked -= 1
            self.scheduler.wake(delivery.queue)
        await self.run()

    async def close(self, consumer: Consumer) -> None:
        """The consumer's channel closes: cancel, then its unacked deliveries go back."""
        channel = consumer.channel
        channel.closing = True
        consumer.queue.remove_consumer(consumer)
        deliveries = list(channel.unacked.values())
        channel.unacked.clear()
        for delivery in deliveries:
            delivery.queue.requeue(delivery.partition, delivery.message)
        await self.run()


def _bodies(*numbers: int) -> list[bytes]:
    return [b"%d" % i for i in numbers]


def _config(path: Path) -> StoreConfig:
    return StoreConfig(
        path, flush=FlushPolicy.ASYNC, segment_size_bytes=64 << 20, cq_entries_per_segment=1000
    )


async def _node(store: EmbeddedStore, arguments: dict[str, Any] | None = None) -> Node:
    definition = QueueDef(
        vhost="/",
        name="fan",
        queue_id=1,
        partitions=PARTITIONS,
        arguments={"x-consume-mode": "broadcast"} if arguments is None else arguments,
    )
    await store.create_queue(1, PARTITIONS)
    queue = QueueRuntime(definition, store)
    await queue.start()
    return Node(store, queue)


def test_every_consumer_gets_every_message_in_publish_order(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with open_store(_config(tmp_path)) as store:
            node = await _node(store)
            consumers = [await node.consume(tag) for tag in ("a", "b", "c")]
            await node.publish(40)
            for consumer in consumers:
                assert node.session.got(consumer.tag) == _bodies(*range(40))
                await node.settle(consumer, 40)
            # Only the consumers' own positions move; the queue itself delivered nothing.
            assert node.queue.delivered == 0
            await node.queue.commit()
            await node.broadcasts.commit()
            for p in range(PARTITIONS):
                assert await store.committed_offset(QUEUE_GROUP, 1, p) == 0
                assert await store.committed_offset("b:a", 1, p) == 20

    anyio.run(scenario)


def test_nack_requeue_goes_back_to_that_consumer_only(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with open_store(_config(tmp_path)) as store:
            node = await _node(store)
            a = await node.consume("a", prefetch=1)
            b = await node.consume("b", prefetch=1)
            await node.publish(3)
            await node.settle(a, 1, requeue=True)  # a's "0" comes back to a, flagged
            await node.settle(b, 1)
            await node.settle(a, 1)
            await node.settle(b, 1)
            await node.settle(a, 1)
            a_got = [(body, again) for who, body, again in node.session.deliveries if who == "a"]
            assert a_got == [(b"0", False), (b"0", True), (b"1", False), (b"2", False)]
            assert node.session.got("b") == _bodies(0, 1, 2)

    anyio.run(scenario)


def test_prefetch_holds_per_consumer(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with open_store(_config(tmp_path)) as store:
            node = await _node(store)
            slow = await node.consume("slow", prefetch=2)
            await node.consume("fast", no_ack=True)
            await node.publish(10)
            assert node.session.got("slow") == _bodies(0, 1)
            assert node.session.got("fast") == _bodies(*range(10))
            await node.settle(slow, 1)
            assert node.session.got("slow") == _bodies(0, 1, 2)

    anyio.run(scenario)


def test_a_new_position_starts_at_the_end_and_a_saved_one_resumes(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with open_store(_config(tmp_path)) as store:
            node = await _node(store)
            idle = await node.consume("idle")  # at an empty queue: its position is 0
            await node.close(idle)
            await node.publish(5)
            a = await node.consume("a")
            assert node.session.got("a") == []  # only what comes after it subscribed
            await node.publish(5)
            assert node.session.got("a") == _bodies(5, 6, 7, 8, 9)
            await node.settle(a, 2)
            await node.close(a)  # 7, 8, 9 unacked: requeued into a's position
            await node.broadcasts.commit()
            assert node.broadcasts.by_queue[node.queue] == {}  # committed, then forgotten
            await node.publish(2)
            # A saved position resumes there (acked messages are not delivered again) ...
            await node.consume("a")
            assert node.session.got("a")[5:] == _bodies(7, 8, 9, 10, 11)
            # ... including one saved at 0: nothing acked, everything published since.
            await node.consume("idle")
            assert node.session.got("idle") == _bodies(*range(12))
            await node.consume("new")  # another name starts at the end
            await node.publish(1)
            assert node.session.got("new") == _bodies(12)

    anyio.run(scenario)


def test_positions_survive_a_store_reopen(tmp_path: Path) -> None:
    async def first_run() -> None:
        async with open_store(_config(tmp_path)) as store:
            node = await _node(store)
            a = await node.consume("a")
            await node.consume("t", persistent=False)  # an unnamed connection's position
            await node.publish(6)
            await node.settle(a, 4)
            await node.close(a)
            await node.broadcasts.commit()

    async def second_run() -> tuple[list[bytes], list[bytes]]:
        async with open_store(_config(tmp_path)) as store:
            node = await _node(store)
            node.published = 6
            await node.consume("a")
            await node.consume("t", persistent=False)
            await node.publish(1)
            return node.session.got("a"), node.session.got("t")

    anyio.run(first_run)
    resumed, fresh = anyio.run(second_run)
    assert resumed == _bodies(4, 5, 6)
    assert fresh == _bodies(6)  # nothing was kept for it: it starts at the end again


def test_a_reconnect_within_the_commit_interval_continues_from_memory(tmp_path: Path) -> None:
    async def scenario() -> tuple[BroadcastSubscription, BroadcastSubscription, list[bytes]]:
        async with open_store(_config(tmp_path)) as store:
            node = await _node(store)
            a = await node.consume("a", prefetch=3)
            await node.publish(5)
            await node.settle(a, 1)
            first = a.queue
            await node.close(a)  # nothing committed since: the store still says 0
            again = await node.consume("a")
            assert isinstance(first, BroadcastSubscription)
            assert isinstance(again.queue, BroadcastSubscription)
            return first, again.queue, node.session.got("a")

    first, second, got = anyio.run(scenario)
    assert second is first
    # 1, 2, 3 were unacked at the close: redelivered from memory; 0 (acked) is not.
    assert got == _bodies(0, 1, 2, 3, 1, 2, 3, 4)


def test_a_position_in_use_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with open_store(_config(tmp_path)) as store:
            node = await _node(store)
            await node.consume("a")
            with pytest.raises(AccessRefused) as info:
                await node.broadcasts.subscribe(node.queue, "b:a", True)
            assert info.value.reply_code == 403
            assert "broadcast position 'b:a'" in info.value.reply_text

    anyio.run(scenario)


def test_message_count_is_the_furthest_behind_consumer(tmp_path: Path) -> None:
    async def scenario() -> list[int]:
        async with open_store(_config(tmp_path)) as store:
            node = await _node(store)
            counts = []
            await node.publish(3)
            counts.append(await node.broadcasts.message_count(node.queue))  # nobody: 0
            ahead = await node.consume("ahead", no_ack=True)
            behind = await node.consume("behind", prefetch=1)
            await node.publish(10)
            counts.append(await node.broadcasts.message_count(node.queue))
            await node.close(behind)
            counts.append(await node.broadcasts.message_count(node.queue))
            await node.close(ahead)
            counts.append(await node.broadcasts.message_count(node.queue))
            return counts

    # behind holds 1 of the 10 unacked: 9 ready; once it leaves, ahead has read everything.
    assert anyio.run(scenario) == [0, 9, 0, 0]


def test_purge_drops_what_each_consumer_has_not_been_given(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with open_store(_config(tmp_path)) as store:
            node = await _node(store)
            a = await node.consume("a", prefetch=2)
            await node.publish(10)
            assert await node.broadcasts.purge(node.queue) == 8
            await node.settle(a, 1, requeue=True)  # requeued after the purge: still a's
            await node.settle(a, 2)
            await node.publish(1)
            assert node.session.got("a") == _bodies(0, 1, 0, 10)

    anyio.run(scenario)


def test_queue_deletion_retires_its_subscriptions(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with open_store(_config(tmp_path)) as store:
            node = await _node(store)
            a = await node.consume("a")
            await node.publish(2)
            await node.settle(a, 1)
            node.broadcasts.queue_deleted(node.queue)
            await store.delete_queue(1)
            subscription = a.queue
            assert subscription.deleted
            await node.broadcasts.commit()  # its offsets are gone with the queue: no commit
            await subscription.commit()
            node.scheduler.wake(subscription)
            assert node.scheduler.ready_count == 0

    anyio.run(scenario)


def test_pause_and_rate_limit_of_the_queue_apply_to_each_consumer(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with open_store(_config(tmp_path)) as store:
            node = await _node(store)
            await node.consume("a", no_ack=True)
            subscription = node.broadcasts.by_queue[node.queue]["b:a"]
            node.queue.paused = True
            await node.publish(3)
            assert node.session.got("a") == []
            node.queue.paused = False
            node.scheduler.wake(node.queue)  # what Node.resume_queue does
            await node.run()
            assert node.session.got("a") == _bodies(0, 1, 2)
            node.queue.rate_limit = TokenBucket(20, 0.0)  # 2 tokens of burst
            await node.publish(5)
            assert node.session.got("a") == _bodies(0, 1, 2, 3, 4)
            assert subscription.rate_limit is not None
            assert subscription.rate_limit is not node.queue.rate_limit  # its own bucket
            assert subscription.pump(16, 0.0) is PumpResult.RATE_LIMITED

    anyio.run(scenario)


def test_a_cluster_queue_is_served_as_before(tmp_path: Path) -> None:
    async def scenario() -> tuple[Any, Any]:
        async with open_store(_config(tmp_path)) as store:
            node = await _node(store, {"x-consume-mode": "cluster"})
            session: Any = StubSession()
            target = await node.broadcasts.consumer_queue(node.queue, session, "c", True)
            return target, node.queue

    target, queue = anyio.run(scenario)
    assert target is queue


@pytest.mark.parametrize(
    ("value", "amqp_type", "problem"),
    [
        ("fanout", "longstr", "invalid_consume_mode"),
        ("Broadcast", "longstr", "invalid_consume_mode"),
        (1, "signedint", "{unacceptable_type,signedint}"),
        (b"broadcast", "binary", "{unacceptable_type,binary}"),
    ],
)
def test_consume_mode_must_be_broadcast_or_cluster(
    value: object, amqp_type: str, problem: str
) -> None:
    definition = QueueDef(
        vhost="v",
        name="q",
        arguments={"x-consume-mode": value},
        argument_types={"x-consume-mode": amqp_type},
    )
    with pytest.raises(MetaPreconditionFailed) as info:
        check_queue_arguments(definition)
    assert info.value.reply_code == 406
    assert info.value.reply_text == (
        f"PRECONDITION_FAILED - invalid arg 'x-consume-mode' for queue 'q' in vhost 'v': {problem}"
    )
    for good in ("broadcast", "cluster"):
        check_queue_arguments(QueueDef(vhost="v", name="q", arguments={"x-consume-mode": good}))
    check_queue_arguments(QueueDef(vhost="v", name="q"))


def test_connection_name_comes_from_client_properties() -> None:
    assert connection_name({"connection_name": "orders-1"}) == "orders-1"
    assert connection_name({"connection_name": b"orders-1"}) == "orders-1"
    assert connection_name({"product": "pika"}) == ""
    assert connection_name({"connection_name": 7}) == ""
