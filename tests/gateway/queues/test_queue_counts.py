"""Counts stay exact whatever happens to a queue (property test, real store).

For random interleavings of publish / deliver / ack / nack / reject / expire / overflow /
purge under random queue settings (TTL, per-message expiration, max-length drop-head, a
dead-letter exchange or none, a delivery limit), after every step:

    published = ready + unacked + acked + dead-lettered + dropped

and the queue's own ready count equals what its cursors, buffer and requeue heap really hold,
every dead-lettered message reached the outbox, and drop-head keeps the length limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.amqp import property_bytes as pb
from gateway.queues.dead_letter import DeadLetter
from gateway.queues.expiry import wall_ms
from gateway.queues.runtime import QueueRuntime
from meta.models import QueueDef
from storage import FlushPolicy, Record, StoreConfig, StoredMessage, open_embedded_store
from storage.record import EXPIRES

OPS = st.one_of(
    st.tuples(st.just("publish"), st.integers(1, 6), st.sampled_from([None, 0, 30, 500])),
    st.tuples(st.just("deliver"), st.integers(1, 5)),
    st.tuples(st.just("ack"), st.integers(0, 50)),
    st.tuples(st.just("nack"), st.integers(0, 50)),
    st.tuples(st.just("reject"), st.integers(0, 50)),
    st.tuples(st.just("advance"), st.sampled_from([10, 40, 120, 600])),
    st.tuples(st.just("expire")),
    st.tuples(st.just("purge")),
)
SETTINGS = st.fixed_dictionaries(
    {},
    optional={
        "x-message-ttl": st.sampled_from([0, 50, 300]),
        "x-max-length": st.integers(0, 8),
        "x-dead-letter-exchange": st.just("dlx"),
        "x-delivery-limit": st.integers(0, 2),
    },
)


def _properties(expiration: int | None) -> bytes:
    if expiration is None:
        return pb.join_properties({})
    return pb.join_properties({pb.EXPIRATION: pb.shortstr(str(expiration))})


def _ttl(arguments: dict[str, Any], properties: bytes) -> int | None:
    own = pb.shortstr_value(pb.split_properties(properties).get(pb.EXPIRATION))
    ttls = [t for t in (arguments.get("x-message-ttl"), own) if t is not None]
    return min(int(t) for t in ttls) if ttls else None


def _really_ready(queue: QueueRuntime, max_offsets: list[int]) -> int:
    unfetched = sum(
        max(0, top - cursor) for top, cursor in zip(max_offsets, queue.cursors, strict=True)
    )
    return unfetched + len(queue.buffer) + len(queue.requeued)


@settings(max_examples=150, deadline=None)
@given(arguments=SETTINGS, ops=st.lists(OPS, max_size=40))
@example(  # a delivery limit of 1: the second return dead-letters
    {"x-delivery-limit": 1, "x-dead-letter-exchange": "dlx"},
    [("publish", 2, None), *[("deliver", 2), ("nack", 0), ("nack", 0)] * 3],
)
@example(  # TTL expiry at the head, with messages in flight and requeued
    {"x-message-ttl": 50, "x-dead-letter-exchange": "dlx"},
    [("publish", 3, None), ("deliver", 1), ("advance", 120), ("nack", 0), ("expire",)],
)
@example(  # per-message expiration only at the head; drop-head over max-length
    {"x-max-length": 2},
    [("publish", 1, None), ("publish", 2, 30), ("advance", 40), ("deliver", 1), ("expire",)],
)
def test_counts_stay_exact(
    tmp_path_factory: Any, arguments: dict[str, Any], ops: list[Any]
) -> None:
    directory: Path = tmp_path_factory.mktemp("counts")

    async def scenario() -> None:
        config = StoreConfig(directory, flush=FlushPolicy.ASYNC, cq_entries_per_segment=1000)
        async with open_embedded_store(config) as store:
            await store.create_queue(1, 1)
            outbox: list[DeadLetter] = []
            definition = QueueDef(vhost="/", name="q", queue_id=1, arguments=arguments)
            queue = QueueRuntime(definition, store, outbox=outbox.append)
            await queue.start()
            unacked: list[tuple[int, StoredMessage]] = []
            skew = 0  # virtual time added to the wall clock
            returns: dict[int, int] = {}  # queue offset -> times nacked with requeue
            published = 0
            checked = 0  # dead letters already checked
            for op in ops:
                now = wall_ms() + skew
                kind = op[0]
                if kind == "publish":
                    _, count, expiration = op
                    flags = 0 if expiration is None else EXPIRES
                    props = _properties(expiration)
                    body = b"%016d" % wall_ms()  # when it entered (the store's clock is later)
                    for _ in range(count):
                        queue.count_in(len(body), flags)
                    await store.append(
                        [Record(b"", b"q", props, body, ((1, 0),), 0, flags)] * count,
                        wait_durable=False,
                    )
                    published += count
                    if queue.behaviour.has_limits and queue.over_limit():
                        await queue.enforce_limits()
                    queue.exhausted = False
                elif kind == "deliver":
                    for _ in range(op[1]):
                        taken = queue.take(now)
                        if taken is None and not queue.exhausted:
                            await queue.fill()
                            taken = queue.take(now)
                        if taken is None:
                            break
                        unacked.append((taken[0], taken[1]))
                        # A delivery limit: never handed out after more returns than it allows.
                        returned = returns.get(taken[1].queue_offset, 0)
                        assert returned <= arguments.get("x-delivery-limit", returned)
                elif kind in ("ack", "nack", "reject") and unacked:
                    partition, message = unacked.pop(op[1] % len(unacked))
                    if kind == "ack":
                        queue.settle(partition, message)
                    elif kind == "nack":
                        returns[message.queue_offset] = returns.get(message.queue_offset, 0) + 1
                        queue.requeue(partition, message)
                    else:
                        queue.reject(partition, message)
                elif kind == "advance":
                    skew += op[1]
                elif kind == "expire":
                    await queue.expire(now)
                elif kind == "purge":
                    await queue.purge()

                stats = await store.queue_stats(1)
                tops = [p.max_offset for p in stats.partitions]
                assert queue.enqueued == published
                assert published == (
                    queue.ready_count
                    + len(unacked)
                    + queue.acked
                    + queue.dead_lettered
                    + queue.dropped
                ), op
                assert queue.ready_count == _really_ready(queue, tops), op
                assert queue.ready_bytes == 16 * queue.ready_count
                assert len(outbox) == queue.dead_lettered
                for letter in outbox[checked:]:  # never expired early
                    if letter.reason == "expired":
                        ttl = _ttl(arguments, letter.properties)
                        assert ttl is not None and now - int(letter.body) >= ttl
                checked = len(outbox)
                if "x-dead-letter-exchange" not in arguments:
                    assert queue.dead_lettered == 0
                limit = arguments.get("x-max-length")
                if limit is not None and kind == "publish":
                    assert queue.ready_count <= limit

    anyio.run(scenario)
