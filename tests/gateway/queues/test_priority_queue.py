"""Priority queues on a real store: delivery order equals a model of RabbitMQ's priority FIFO.

The model (rabbit_priority_queue over per-priority backing queues): every ready message is
ordered by (higher priority first, then publish order); a message without a priority is 0,
one above the maximum counts as the maximum; a requeued message keeps its place; a restart
resumes from the lowest unsettled offset (mqgw's at-least-once: acked messages behind it come
again). Random publishes (one or two log partitions), basic.get, acks, requeues, write-through
(the batch in hand), restarts and a tiny in-memory window (so the index keeps most messages as
runs of offsets and reads them back) must all keep that order and exact counts.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import gateway.queues.priority as pq
from gateway.amqp import property_bytes as pb
from gateway.features.queue_kinds import consumer_choice, new_queue_runtime, runtime_class
from gateway.queues.consumer_choice import ConsumerChoice
from gateway.queues.priority_index import message_priority
from gateway.queues.runtime import QueueRuntime
from gateway.queues.single_active import SingleActiveChoice
from gateway.vhost import VirtualHost
from meta.errors import PreconditionFailed
from meta.models import QueueDef
from meta.queue_arguments import check_queue_arguments
from storage import (
    QUEUE_GROUP,
    EmbeddedStore,
    FlushPolicy,
    Record,
    StoreConfig,
    open_embedded_store,
)

OPS = st.one_of(
    st.tuples(st.just("publish"), st.lists(st.sampled_from([None, 0, 1, 2, 3, 5, 9, 200]))),
    st.tuples(st.just("get"), st.integers(1, 4)),
    st.tuples(st.just("ack"), st.integers(0, 30)),
    st.tuples(st.just("requeue"), st.integers(0, 30)),
    st.tuples(st.just("restart")),
)


def _properties(priority: int | None, headers: bool = False) -> bytes:
    fields: dict[int, bytes] = {pb.CONTENT_TYPE: pb.shortstr("text/plain")}
    if headers:  # a field table before the priority: the reader must skip it
        fields[pb.HEADERS] = pb.join_table([("k", "S", pb.longstr("v" * 300))])
    fields[pb.DELIVERY_MODE] = b"\x02"
    if priority is not None:
        fields[pb.PRIORITY] = bytes([priority])
    return pb.join_properties(fields)


def test_priority_is_read_from_the_property_bytes() -> None:
    assert message_priority(_properties(None), 10) == 0
    assert message_priority(_properties(7), 10) == 7
    assert message_priority(_properties(7, headers=True), 10) == 7
    assert message_priority(memoryview(_properties(200)), 10) == 10  # capped
    assert message_priority(b"", 10) == 0
    assert message_priority(b"\x08\x00", 10) == 0  # flag without its byte


def test_the_runtime_follows_the_arguments() -> None:
    def kind(**arguments: Any) -> tuple[type[QueueRuntime], type[ConsumerChoice]]:
        definition = QueueDef(vhost="/", name="q", arguments=arguments)
        return runtime_class(definition), type(consumer_choice(definition))

    fifo = QueueRuntime, ConsumerChoice
    priority = pq.PriorityQueueRuntime, ConsumerChoice
    assert kind() == fifo
    assert kind(**{"x-max-priority": 5}) == priority
    assert kind(**{"x-max-priority": 0}) == priority
    assert kind(**{"x-max-priority": "high"}) == fifo  # from before validation
    assert kind(**{"x-max-priority": 5, "x-queue-type": "quorum"}) == fifo
    assert kind(**{"x-single-active-consumer": True}) == (QueueRuntime, SingleActiveChoice)
    assert kind(**{"x-single-active-consumer": False}) == fifo
    both = {"x-single-active-consumer": True, "x-max-priority": 3}
    assert kind(**both) == (pq.PriorityQueueRuntime, SingleActiveChoice)


@pytest.mark.parametrize("key, value", [("x-max-priority", 5), ("x-single-active-consumer", True)])
def test_not_with_broadcast_consumption(key: str, value: object) -> None:
    """A broadcast queue's consumers each read their own position: no shared head to order
    by priority, and every consumer gets every message."""
    arguments = {"x-consume-mode": "broadcast", key: value}
    with pytest.raises(PreconditionFailed) as info:
        check_queue_arguments(QueueDef(vhost="v", name="q", arguments=arguments))
    assert info.value.reply_text == (
        f"PRECONDITION_FAILED - invalid arg '{key}' for queue 'q' in vhost 'v': not supported "
        "with x-consume-mode broadcast (each consumer has its own position)"
    )


class Model:
    """RabbitMQ's priority FIFO with mqgw's restart rule (see the module doc)."""

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.levels: list[int] = []  # per message (by publish number): its level
        self.partition: list[int] = []
        self.offset: list[int] = []  # its offset in its partition
        self.ready: set[int] = set()
        self.unacked: list[int] = []
        self.acked: set[int] = set()
        self.returned: set[int] = set()

    def publish(self, priority: int | None, partition: int, offset: int) -> None:
        number = len(self.levels)
        self.levels.append(0 if priority is None else min(priority, self.maximum))
        self.partition.append(partition)
        self.offset.append(offset)
        self.ready.add(number)

    def next(self) -> int | None:
        return min(self.ready, key=lambda n: (-self.levels[n], n), default=None)

    def restart(self, partitions: int) -> None:
        """Each partition resumes at its lowest unsettled offset: everything from there on
        is ready again, acked or not."""
        for p in range(partitions):
            mine = [n for n in range(len(self.levels)) if self.partition[n] == p]
            low = min((self.offset[n] for n in mine if n not in self.acked), default=None)
            for n in mine:
                if low is not None and self.offset[n] >= low:
                    self.acked.discard(n)
                    self.ready.add(n)
        self.unacked.clear()
        self.returned.clear()


async def _new_queue(store: EmbeddedStore, definition: QueueDef) -> pq.PriorityQueueRuntime:
    queue = new_queue_runtime(definition, store)
    assert isinstance(queue, pq.PriorityQueueRuntime)
    await queue.start()
    return queue


async def _append(
    store: EmbeddedStore, queue: QueueRuntime, records: list[Record], through: bool
) -> None:
    """Append; ``through``: hand the new messages over as the vhost's write-through does."""
    for record in records:
        queue.count_in(len(record.body))
    result = await store.append(records, wait_durable=False)
    if through:
        vhost = SimpleNamespace(queues_by_id={queue.queue_id: queue})
        VirtualHost._absorb(vhost, records, result)  # type: ignore[arg-type]
    queue.exhausted = queue.exhausted and through  # as wake_new_messages says otherwise


@settings(max_examples=120, deadline=None)
@given(
    maximum=st.sampled_from([0, 1, 3, 10, 255]),
    partitions=st.sampled_from([1, 1, 2]),
    window=st.sampled_from([2, 5, 1024]),
    through=st.booleans(),
    ops=st.lists(OPS, max_size=30),
)
@example(  # requeued messages go back to their place within their own level
    maximum=5,
    partitions=1,
    window=1024,
    through=False,
    ops=[
        ("publish", [1, 1, 3, 3, 0]),
        ("get", 3),
        ("requeue", 0),
        ("requeue", 1),
        ("publish", [3]),
        ("get", 4),
    ],
)
@example(  # most of the backlog kept as runs of offsets, read back level by level
    maximum=9,
    partitions=1,
    window=2,
    through=False,
    ops=[("publish", [0, 9, 0, 0, 9, 9, 5, 0, 5]), ("get", 4), ("restart",), ("get", 4)],
)
@example(  # two partitions: one level's messages are merged in publish order
    maximum=3,
    partitions=2,
    window=1024,
    through=False,
    ops=[("publish", [1, 1, 1, 1, 1, 1, 2, 0]), ("get", 8)],
)
def test_delivery_order_is_rabbitmq_priority_fifo(
    tmp_path_factory: Any,
    maximum: int,
    partitions: int,
    window: int,
    through: bool,
    ops: list[Any],
) -> None:
    directory: Path = tmp_path_factory.mktemp("priority")
    definition = QueueDef(
        vhost="/",
        name="q",
        queue_id=1,
        partitions=partitions,
        arguments={"x-max-priority": maximum},
    )
    model = Model(maximum)

    async def scenario() -> None:
        config = StoreConfig(directory, flush=FlushPolicy.ASYNC, cq_entries_per_segment=1000)
        async with open_embedded_store(config) as store:
            await store.create_queue(1, partitions)
            queue = await _new_queue(store, definition)
            if through:
                queue.consumers.append(SimpleNamespace())  # type: ignore[arg-type]
            unacked: list[tuple[int, Any]] = []
            next_offset = [0] * partitions
            for op in ops:
                kind = op[0]
                if kind == "publish":
                    records = []
                    for i, priority in enumerate(op[1]):
                        partition = (len(model.levels) + i) % partitions
                        body = b"%d" % (len(model.levels))
                        model.publish(priority, partition, next_offset[partition])
                        next_offset[partition] += 1
                        properties = _properties(priority)
                        records.append(Record(b"", b"q", properties, body, ((1, partition),)))
                    if records:
                        await _append(store, queue, records, through)
                elif kind == "get":
                    for _ in range(op[1]):
                        expected = model.next()
                        taken = await queue.get()
                        if expected is None:
                            assert taken is None
                            break
                        assert taken is not None, (expected, model.ready)
                        partition, message, redelivered = taken
                        assert int(bytes(message.body)) == expected
                        assert redelivered == (expected in model.returned)
                        model.ready.discard(expected)
                        model.unacked.append(expected)
                        unacked.append((partition, message))
                elif kind in ("ack", "requeue") and unacked:
                    index = op[1] % len(unacked)
                    partition, message = unacked.pop(index)
                    number = model.unacked.pop(index)
                    if kind == "ack":
                        queue.settle(partition, message)
                        model.acked.add(number)
                    else:
                        queue.requeue(partition, message)
                        model.ready.add(number)
                        model.returned.add(number)
                elif kind == "restart":
                    await queue.commit()
                    queue = await _new_queue(store, definition)
                    if through:
                        queue.consumers.append(SimpleNamespace())  # type: ignore[arg-type]
                    unacked.clear()
                    model.restart(partitions)
                assert queue.ready_count == len(model.ready), op
                in_window = sum(len(level.loaded) for level in queue.levels)
                assert queue.loaded_count == in_window

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pq, "LOADED_MAX", window)
        patch.setattr(pq, "FETCH_BATCH", 4)  # short reads: runs are read back in pieces
        patch.setattr(pq, "LOW_WATER", 2)
        anyio.run(scenario)


def test_a_large_backlog_is_scanned_without_holding_it(tmp_path: Path) -> None:
    """50,000 messages of alternating levels: the index holds LOADED_MAX of them in memory
    and the rest as runs; delivery still goes level by level in publish order."""

    async def scenario() -> None:
        config = StoreConfig(tmp_path, flush=FlushPolicy.ASYNC)
        async with open_embedded_store(config) as store:
            await store.create_queue(1, 1)
            definition = QueueDef(vhost="/", name="q", queue_id=1, arguments={"x-max-priority": 2})
            queue = await _new_queue(store, definition)
            records = [
                Record(b"", b"q", _properties(n % 3), b"%d" % n, ((1, 0),)) for n in range(50_000)
            ]
            await _append(store, queue, records, through=False)
            taken = await queue.get()
            assert queue.loaded_count <= pq.LOADED_MAX
            bodies = [int(bytes(taken[1].body))] if taken else []
            while (taken := await queue.get()) is not None:
                bodies.append(int(bytes(taken[1].body)))
            expected = [n for level in (2, 1, 0) for n in range(50_000) if n % 3 == level]
            assert bodies == expected

    anyio.run(scenario)


def test_take_over_rebuilds_the_index_from_the_committed_offset(tmp_path: Path) -> None:
    """Cluster hook: this gateway takes the partition's delivery lease back after another
    delivered from it and let it lapse (no note); the index restarts at the broker's
    committed offset, in priority order, flagged as possibly delivered."""

    async def scenario() -> None:
        config = StoreConfig(tmp_path, flush=FlushPolicy.ASYNC)
        async with open_embedded_store(config) as store:
            await store.create_queue(1, 1)
            definition = QueueDef(vhost="/", name="q", queue_id=1, arguments={"x-max-priority": 3})
            queue = await _new_queue(store, definition)
            queue.leases = [True]
            priorities = [0, 3, 1, 3, 0, 2, 1, 0, 3, 2]
            records = [
                Record(b"", b"q", _properties(p), b"%d" % n, ((1, 0),))
                for n, p in enumerate(priorities)
            ]
            await _append(store, queue, records, through=False)
            assert (await queue.get()) is not None  # the index is built and one is out
            # What the other gateway (lease token 7) settled before its lease lapsed.
            await store.commit_offset(QUEUE_GROUP, 1, 0, 5, fence=7)
            queue.fences[0] = 8
            await queue.take_over(0, None)
            assert queue.ready_count == 5
            got = []
            while (taken := await queue.get()) is not None:
                got.append((int(bytes(taken[1].body)), taken[2]))
            # Offsets 5-9 have priorities 2 1 0 3 2.
            assert got == [(8, True), (5, True), (9, True), (6, True), (7, True)]

    anyio.run(scenario)


class _HeldReads:
    """The store, but a read's answer (taken at once) is held until ``release``: an append
    can land while a scan is out, as over a remote store."""

    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store
        self.answered = anyio.Event()
        self.release = anyio.Event()
        self.release.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    async def read(self, *args: Any, **kwargs: Any) -> Any:
        result = await self.store.read(*args, **kwargs)
        self.answered.set()
        await self.release.wait()
        return result


def test_a_message_appended_while_a_scan_is_out_outranks_the_head(tmp_path: Path) -> None:
    """'high' lands while the scan that found 'low' is out: the next delivery is 'high'.
    Before, the scan's end marked the queue read to the end, and 'low' went first (seen
    over RocketMQ, where a scan takes a round trip)."""

    async def scenario() -> None:
        config = StoreConfig(tmp_path, flush=FlushPolicy.ASYNC)
        async with open_embedded_store(config) as embedded:
            await embedded.create_queue(1, 1)
            store = _HeldReads(embedded)
            definition = QueueDef(vhost="/", name="q", queue_id=1, arguments={"x-max-priority": 5})
            queue = new_queue_runtime(definition, store)  # type: ignore[arg-type]
            await queue.start()
            await _append(embedded, queue, [Record(b"", b"q", _properties(1), b"low", ((1, 0),))],
                          through=False)  # fmt: skip
            store.answered, store.release = anyio.Event(), anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(queue.fill)
                await store.answered.wait()  # the scan has its answer: 'low' only
                high = Record(b"", b"q", _properties(5), b"high", ((1, 0),))
                await _append(embedded, queue, [high], through=True)  # refused: scanning
                queue.appends_done += 1  # as VirtualHost.stored counts it
                store.release.set()
            assert not queue.exhausted
            taken = await queue.get()
            assert taken is not None and bytes(taken[1].body) == b"high"

    anyio.run(scenario)
