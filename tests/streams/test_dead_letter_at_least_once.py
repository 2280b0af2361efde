"""x-dead-letter-strategy at-least-once on the queue runtime with a real store: a rejected
message holds the queue's committed offset until its dead letter is stored, and only where
RabbitMQ applies the strategy (quorum, reject-publish, a dead-letter exchange)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from gateway.features.queue_kinds import new_queue_runtime
from gateway.queues.dead_letter import DeadLetter
from meta.models import QueueDef
from storage import FlushPolicy, Record, StoreConfig, open_embedded_store

AT_LEAST_ONCE = {
    "x-queue-type": "quorum",
    "x-dead-letter-strategy": "at-least-once",
    "x-overflow": "reject-publish",
    "x-dead-letter-exchange": "dlx",
}


@pytest.mark.parametrize(
    ("arguments", "held"),
    [
        (AT_LEAST_ONCE, True),
        ({**AT_LEAST_ONCE, "x-overflow": "drop-head"}, False),  # RabbitMQ falls back
        ({**AT_LEAST_ONCE, "x-dead-letter-strategy": "at-most-once"}, False),
        ({**AT_LEAST_ONCE, "x-queue-type": "classic"}, False),
    ],
)
def test_rejected_message_is_settled_when_its_dead_letter_is_stored(
    tmp_path: Path, arguments: dict[str, Any], held: bool
) -> None:
    async def scenario() -> None:
        async with open_embedded_store(StoreConfig(tmp_path, flush=FlushPolicy.ASYNC)) as store:
            await store.create_queue(1, 1)
            letters: list[DeadLetter] = []
            definition = QueueDef(vhost="/", name="q", queue_id=1, arguments=arguments)
            queue = new_queue_runtime(definition, store, outbox=letters.append)
            await queue.start()
            records = [Record(b"", b"q", b"\x00\x00", b"m%d" % i, ((1, 0),)) for i in range(2)]
            for record in records:
                queue.count_in(len(record.body))
            await store.append(records, wait_durable=False)
            taken = await queue.get()
            assert taken is not None
            queue.reject(taken[0], taken[1])
            assert len(letters) == 1 and queue.dead_lettered == 1
            settled = letters[0].settled
            assert (settled is not None) == held
            # Offset 0 waits for its dead letter (at-least-once) or is settled already.
            assert queue.committed_offsets() == [0 if held else 1]
            await queue.commit()
            assert await store.committed_offset("$queue", 1, 0) == (0 if held else 1)
            if settled is not None:
                settled()
                assert queue.committed_offsets() == [1]
                await queue.commit()
                assert await store.committed_offset("$queue", 1, 0) == 1

    anyio.run(scenario)
