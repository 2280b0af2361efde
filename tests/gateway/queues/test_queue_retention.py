"""Retention made visible: unread messages the store's retention removes are counted in the
queue's stats and logged, and the queue's ready count follows (never silently)."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest

from gateway.queues.runtime import QueueRuntime
from meta.models import QueueDef
from storage import FlushPolicy, Record, StoreConfig, open_embedded_store
from tests.harness.clock import FakeClock


def test_retention_losses_are_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = StoreConfig(
        tmp_path,
        flush=FlushPolicy.ASYNC,
        segment_size_bytes=4096,
        cq_entries_per_segment=16,
        max_record_bytes=1024,
        retention_ms=60_000,
    )
    clock = FakeClock(1_000_000)

    async def scenario() -> tuple[int, int, int, list[bytes]]:
        async with open_embedded_store(config, clock=clock) as store:
            await store.create_queue(1, 1)
            queue = QueueRuntime(QueueDef(vhost="/", name="slow", queue_id=1), store)
            await queue.start()
            for i in range(60):
                queue.count_in(70)
                await store.append([Record(b"", b"", b"", b"old%02d" % i + b"." * 65, ((1, 0),))])
            clock.now_ms += config.retention_ms + 1
            queue.count_in(5)
            await store.append([Record(b"", b"", b"", b"fresh", ((1, 0),))])
            report = await store.apply_retention()
            lost = report.dropped_unread[1]
            bodies = []
            while (taken := queue.take()) is not None or not queue.exhausted:
                if taken is None:
                    await queue.fill()
                    continue
                bodies.append(bytes(taken[1].body))
            return lost, queue.dropped_by_retention, queue.ready_count, bodies

    with caplog.at_level(logging.WARNING, logger="mqgw.queue"):
        lost, counted, ready, bodies = anyio.run(scenario)
    assert 0 < lost < 60
    assert counted == lost
    assert ready == 0  # what was left was delivered; the lost ones are no longer counted
    assert len(bodies) == 61 - lost and bodies[-1] == b"fresh"
    assert f"queue 'slow': {lost} unread message(s) removed by the store's retention" in caplog.text
