"""Keyed-order queues against a model (Hypothesis, deterministic): random sequences of
publishes from several channels (a batch may be routed before a change and appended after
it), split/merge/move, consumers joining, leaving and requeueing, acks out of order. Run on
the real vhost, embedded store, metadata file, push scheduler and route keeper, with stub
sessions. Checked: per key, the deliveries not flagged redelivered are the key's messages
in publish order, each once, and nothing is lost once everything is acked.

The default tier runs small sizes; ``slow`` runs 100,000 messages."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.queues.ordered import OrderedRuntime
from gateway.queues.scheduler import PushScheduler
from gateway.sessions.channel_state import ChannelState, Consumer
from gateway.vhost.host import VirtualHost
from gateway.vhost.rescale import RouteKeeper, Step, apply_step, settled
from meta.local_store import LocalMetadataStore
from meta.models import QueueDef, VHost
from meta.queue_route import RouteRefused
from storage import FlushPolicy, Record, StoreConfig, open_embedded_store
from tests.harness.clock import FakeClock
from tests.harness.stub_session import StubSession

KEYED = {"x-mqgw-ordering": "key", "x-mqgw-logical-partitions": 64}


class World:
    """One vhost with one keyed queue, its consumers and the publishes in flight."""

    def __init__(self, host: VirtualHost, queue: OrderedRuntime, keeper: RouteKeeper) -> None:
        self.host = host
        self.queue = queue
        self.keeper = keeper
        self.session = StubSession()
        self.consumers: list[Consumer] = []
        self.next_seq: dict[str, int] = {}
        self.in_flight: list[tuple[int, list[Record]]] = []  # (route epoch, batch)
        self.published = 0
        self.tags = 0

    def route_batch(self, keys: list[str]) -> None:
        """Route a batch now (as the session does) and keep it for a later append."""
        records = []
        for key in keys:
            seq = self.next_seq.get(key, 0)
            self.next_seq[key] = seq + 1
            body = f"{key}:{seq}".encode()
            partition = self.queue.key_partition(key, None)
            self.queue.count_in(len(body))
            records.append(Record(b"", key.encode(), b"\x00\x00", body,
                                  ((self.queue.queue_id, partition),)))  # fmt: skip
            self.published += 1
        self.in_flight.append((self.host.route_epoch, records))

    async def append_oldest(self) -> None:
        epoch, records = self.in_flight.pop(0)
        records = self.host.for_append(records, epoch)
        result = await self.host.store.append(records, wait_durable=False)
        await self.host.stored({self.queue}, records, result)

    def join(self, prefetch: int) -> None:
        self.tags += 1
        channel = ChannelState(self.tags, self.session)  # type: ignore[arg-type]
        consumer = Consumer(f"c{self.tags}", channel, self.queue, False, False, 0, prefetch)
        channel.consumers[consumer.tag] = consumer
        self.queue.add_consumer(consumer)
        self.consumers.append(consumer)
        self.host.scheduler.wake(self.queue)

    def leave(self, index: int) -> None:
        """A channel closing: the consumer goes, its unacked come back (as the session)."""
        consumer = self.consumers.pop(index % len(self.consumers))
        consumer.channel.consumers.pop(consumer.tag)
        self.queue.remove_consumer(consumer)
        for tag in sorted(consumer.channel.unacked):
            delivery = consumer.channel.unacked.pop(tag)
            self.queue.requeue(delivery.partition, delivery.message)
        consumer.unacked = 0
        self.host.scheduler.wake(self.queue)

    def settle(self, index: int, requeue: bool, rng: random.Random) -> None:
        """Ack (or nack with requeue) some of one consumer's unacked, in any order."""
        if not self.consumers:
            return
        consumer = self.consumers[index % len(self.consumers)]
        tags = list(consumer.channel.unacked)
        rng.shuffle(tags)
        for tag in tags[: rng.randint(1, max(1, len(tags)))]:
            delivery = consumer.channel.unacked.pop(tag)
            consumer.unacked -= 1
            if requeue:
                self.queue.requeue(delivery.partition, delivery.message)
            else:
                self.queue.settle(delivery.partition, delivery.message)
        self.host.scheduler.wake(self.queue)

    async def deliver(self) -> None:
        while await self.host.scheduler.turn():
            pass

    async def rescale(self, kind: str, n: int) -> None:
        route = self.queue.route
        open_parts = route.open_partitions()
        p = open_parts[n % len(open_parts)]
        ranges = sorted(route.ranges, key=lambda r: r.start)
        i = [r.partition for r in ranges].index(p)
        neighbour = ranges[i + 1 if i + 1 < len(ranges) else max(0, i - 1)].partition
        step = {"split": Step("split", p), "move": Step("move", p),
                "merge": Step("merge", p, other=neighbour)}[kind]  # fmt: skip
        with contextlib.suppress(RouteRefused):
            await apply_step(self.host, self.queue, step)

    async def finish(self) -> None:
        """Append everything, keep one consumer, and ack until all is delivered and done."""
        while self.in_flight:
            await self.append_oldest()
        if not self.consumers:
            self.join(prefetch=50)
        idle = 0  # passes in a row that delivered nothing: 3 and the queue is stuck
        while idle < 3:
            seen = len(self.session.deliveries)
            await self.deliver()
            for consumer in self.consumers:
                for tag in list(consumer.channel.unacked):
                    delivery = consumer.channel.unacked.pop(tag)
                    consumer.unacked -= 1
                    self.queue.settle(delivery.partition, delivery.message)
            await self.keeper.pass_once()
            self.host.scheduler.wake(self.queue)
            if (
                settled(self.queue, self.keeper)
                and self.queue.ready_count == 0
                and not any(c.channel.unacked for c in self.consumers)
            ):
                await self.deliver()
                return
            idle = 0 if len(self.session.deliveries) > seen else idle + 1
        q = self.queue
        raise AssertionError(
            f"the queue never settled: {q.route.in_progress()}, ready {q.ready_count}, held "
            f"{q.held_total}, readable {q.readable}, owners {sorted(q.holders.owners)}, orphans "
            f"{q.holders.orphans}, cursors {q.cursors}, committed {q.committed_offsets()}"
        )

    def check(self) -> None:
        by_key: dict[str, list[int]] = {}
        for _tag, body, redelivered in self.session.deliveries:
            key, seq = body.decode().rsplit(":", 1)
            numbers = by_key.setdefault(key, [])
            if redelivered:
                assert int(seq) in numbers, f"{key}:{seq} flagged redelivered, never delivered"
            else:
                numbers.append(int(seq))
        for key, count in self.next_seq.items():
            assert by_key.get(key, []) == list(range(count)), (key, by_key.get(key, [])[:40])


async def run_world(data: Path, ops: list[tuple[str, int]], seed: int, partitions: int) -> World:
    clock = FakeClock()
    rng = random.Random(seed)
    config = StoreConfig(data / "store", flush=FlushPolicy.ASYNC, cq_entries_per_segment=4096)
    async with open_embedded_store(config) as store:
        meta = LocalMetadataStore(data / "meta")
        await meta.add_vhost(VHost(name="/"))
        scheduler = PushScheduler(clock=clock)
        host = VirtualHost("/", meta, store, scheduler, partitions)
        await host.load()
        definition = QueueDef(vhost="/", name="orders", durable=True, arguments=KEYED)
        queue = await host.declare_queue(host.with_partitions(definition), False, "")
        assert isinstance(queue, OrderedRuntime)
        keeper = RouteKeeper(lambda: [(host, queue)])
        world = World(host, queue, keeper)
        keys = [f"k{i}" for i in range(12)]
        for op, n in ops:
            if op == "publish":
                world.route_batch([rng.choice(keys) for _ in range(1 + n % 7)])
            elif op == "append" and world.in_flight:
                await world.append_oldest()
            elif op in ("split", "merge", "move"):
                await world.rescale(op, n)
            elif op == "keep":
                await keeper.pass_once()
            elif op == "join":
                world.join(prefetch=1 + n % 5)
            elif op == "leave" and world.consumers:
                world.leave(n)
            elif op in ("ack", "nack"):
                world.settle(n, op == "nack", rng)
            elif op == "deliver":
                await world.deliver()
        await world.finish()
        await meta.close()
        return world


OPS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "publish",
                "publish",
                "append",
                "append",
                "split",
                "merge",
                "move",
                "keep",
                "join",
                "leave",
                "ack",
                "ack",
                "nack",
                "deliver",
                "deliver",
            ]
        ),
        st.integers(0, 50),
    ),
    min_size=20,
    max_size=120,
)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(ops=OPS, seed=st.integers(0, 1000), partitions=st.integers(1, 3))
def test_per_key_order_and_no_loss_against_the_model(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]], seed: int,
    partitions: int,
) -> None:  # fmt: skip
    data = tmp_path_factory.mktemp("ordered")
    world = anyio.run(run_world, data, ops, seed, partitions)
    world.check()
    assert world.queue.ready_count == 0


def test_a_batch_routed_before_a_split_and_appended_after_lands_in_the_new_partition(
    tmp_path: Path,
) -> None:
    """The reroute: without it the batch would land in the closed partition after its
    command record, and its key's later messages (in the new partition) could pass it."""

    async def racing() -> None:
        clock = FakeClock()
        config = StoreConfig(tmp_path / "race", flush=FlushPolicy.ASYNC)
        async with open_embedded_store(config) as store:
            meta = LocalMetadataStore(tmp_path / "race-meta")
            await meta.add_vhost(VHost(name="/"))
            host = VirtualHost("/", meta, store, PushScheduler(clock=clock), 1)
            await host.load()
            definition = QueueDef(vhost="/", name="orders", durable=True, arguments=KEYED)
            queue = await host.declare_queue(host.with_partitions(definition), False, "")
            assert isinstance(queue, OrderedRuntime)
            world = World(host, queue, RouteKeeper(lambda: [(host, queue)]))
            world.route_batch(["k1", "k2"])  # routed to partition 0 under version 1
            await world.rescale("split", 0)
            part = queue.route.partitions[0]
            assert part.state == "draining" and part.closed_at == 0
            await world.append_oldest()
            stats = await store.queue_stats(queue.queue_id)
            assert stats.partitions[0].max_offset == 1  # the command record alone
            assert sum(s.max_offset for s in stats.partitions[1:]) == 2
            await meta.close()

    anyio.run(racing)


@pytest.mark.slow
def test_per_key_order_over_100_000_messages(tmp_path: Path) -> None:
    rng = random.Random(7)
    kinds = ["publish"] * 60 + ["append"] * 60 + ["split", "merge", "move", "keep", "join",
             "leave"] + ["ack"] * 20 + ["nack"] * 2 + ["deliver"] * 30  # fmt: skip
    ops: list[tuple[str, int]] = []
    while sum(1 + n % 7 for op, n in ops if op == "publish") < 100_000:
        ops.append((rng.choice(kinds), rng.randrange(50)))
    world = anyio.run(run_world, tmp_path, ops, 7, 2)
    world.check()
    assert world.published >= 100_000
