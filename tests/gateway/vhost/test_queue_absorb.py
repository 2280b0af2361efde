"""Write-through delivery: a queue that has read everything takes the messages of a new
append from the batch in hand, and they are exactly what reading them back would give."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from gateway.queues.scheduler import PushScheduler
from gateway.sessions.channel_state import ChannelState, Consumer
from gateway.vhost import VirtualHost
from meta.local_store import LocalMetadataStore
from meta.models import QueueDef
from storage import FlushPolicy, Record, StoreConfig, open_embedded_store


def _fields(message: Any) -> tuple[Any, ...]:
    return (
        message.queue_offset,
        message.commit_offset,
        message.exchange,
        message.routing_key,
        bytes(message.properties),
        bytes(message.body),
        message.born_ts_ms,
        message.store_ts_ms,
        message.flags,
    )


def test_caught_up_queues_take_new_messages_from_the_batch(tmp_path: Path) -> None:
    async def scenario() -> None:
        config = StoreConfig(tmp_path / "store", flush=FlushPolicy.ASYNC)
        async with open_embedded_store(config) as store:
            meta = LocalMetadataStore(tmp_path / "meta")
            vhost = VirtualHost("/", meta, store, PushScheduler(), partitions=2)
            await vhost.load()
            fast = await vhost.declare_queue(
                QueueDef(vhost="/", name="fast", partitions=2), False, "c"
            )
            behind = await vhost.declare_queue(QueueDef(vhost="/", name="behind"), False, "c")
            idle = await vhost.declare_queue(QueueDef(vhost="/", name="idle"), False, "c")
            for queue in (fast, behind):
                channel = ChannelState(1, None)  # type: ignore[arg-type]
                queue.add_consumer(Consumer("t", channel, queue, True, False, 0, 0))
            # "behind" has an unread message in the store: it must not skip it.
            old = Record(b"", b"behind", b"\x00\x00", b"old", ((behind.queue_id, 0),))
            await store.append([old])
            for queue in (fast, behind, idle):
                await queue.fill()
            behind.exhausted = True  # as if woken before the old message's fetch
            behind.buffer.clear()
            behind.cursors[0] = 0
            records = [
                Record(
                    b"x",
                    b"k%d" % i,
                    b"\x10\x00\x02",
                    b"m%d" % i,
                    ((fast.queue_id, i % 2), (behind.queue_id, 0), (idle.queue_id, 0)),
                    1234,
                    1,
                )
                for i in range(5)
            ]
            for record in records:
                for queue in (fast, behind, idle):
                    queue.count_in(len(record.body))
            result = await store.append(records, wait_durable=False)
            await vhost.stored({fast, behind, idle}, records, result)

            # The caught-up queue has them, in order, identical to a read back.
            absorbed = [(p, _fields(m)) for p, m in fast.buffer]
            assert [m[5] for _, m in absorbed] == [b"m0", b"m1", b"m2", b"m3", b"m4"]
            assert fast.cursors == [3, 2] and fast.exhausted
            read = []
            for partition in (0, 1):
                got = await store.read(fast.queue_id, partition, 0, 10)
                read += [(partition, _fields(m)) for m in got.messages]
            assert sorted(absorbed) == sorted(read)
            assert fast.committed_offsets() == [0, 0]  # nothing delivered yet
            # Not caught up, or no consumer: nothing taken, they read from the store.
            assert not behind.buffer and not behind.exhausted
            assert not idle.buffer and not idle.exhausted

    anyio.run(scenario)
