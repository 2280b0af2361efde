"""The unacknowledged count of a queue runtime started on a store that already holds its
messages (a restarted node), over a real embedded store: it is the deliveries outstanding,
not what the runtime's traffic counters (0 at its start) leave over, and an offset held only
until its at-least-once dead letter is stored is not one of them."""

from __future__ import annotations

from pathlib import Path

import anyio

from gateway.features.queue_kinds import new_queue_runtime
from gateway.observe.stats import queue_unacked
from gateway.queues.dead_letter import DeadLetter
from meta.models import QueueDef
from storage import FlushPolicy, Record, StoreConfig, open_embedded_store

AT_LEAST_ONCE = {
    "x-queue-type": "quorum",
    "x-dead-letter-strategy": "at-least-once",
    "x-overflow": "reject-publish",
    "x-dead-letter-exchange": "dlx",
}


def test_unacked_after_a_restart_counts_deliveries_not_counters(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with open_embedded_store(StoreConfig(tmp_path, flush=FlushPolicy.ASYNC)) as store:
            await store.create_queue(1, 1)
            definition = QueueDef(vhost="/", name="q", queue_id=1, arguments=AT_LEAST_ONCE)
            before = new_queue_runtime(definition, store)
            await before.start()
            records = [Record(b"", b"q", b"\x00\x00", b"m%d" % i, ((1, 0),)) for i in range(5)]
            for record in records:
                before.count_in(len(record.body))
            await store.append(records, wait_durable=False)
            first = await before.get()
            assert first is not None
            before.settle(first[0], first[1])
            await before.commit()

            # The node restarts: a new runtime on the same store, its counters at 0.
            letters: list[DeadLetter] = []
            queue = new_queue_runtime(definition, store, outbox=letters.append)
            await queue.start()
            assert (queue.ready_count, queue_unacked(queue)) == (4, 0)  # was (4, -4)
            taken = [await queue.get() for _ in range(2)]
            assert (queue.ready_count, queue_unacked(queue)) == (2, 2)  # was (2, -2)
            second = taken[1]
            assert second is not None
            queue.settle(second[0], second[1])
            assert (queue.ready_count, queue_unacked(queue)) == (2, 1)  # was (2, -3)
            rejected = taken[0]
            assert rejected is not None
            queue.reject(rejected[0], rejected[1])
            # Its offset stays in flight until the dead letter is stored: not a delivery.
            assert letters[0].settled is not None and rejected[1].queue_offset in queue.inflight[0]
            assert (queue.ready_count, queue_unacked(queue)) == (2, 0)  # was (2, -4)
            letters[0].settled()
            assert (queue.ready_count, queue_unacked(queue)) == (2, 0)

    anyio.run(scenario)
