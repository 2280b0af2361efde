"""A fill reads its partitions one after the other. While the second read is out, the first
partition's messages are read but not yet buffered: a commit then (a lease's last commit before
a hand-over) must stay below them, and a read that fails must leave them to be read again.
Before the fix the first cursor moved at once, so the commit passed them and they were lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from gateway.queues.runtime import QueueRuntime
from gateway.queues.scheduler import PushScheduler
from gateway.vhost import VirtualHost
from meta.local_store import LocalMetadataStore
from meta.models import QueueDef
from storage import EmbeddedStore, ReadResult, Record, StoreError, open_embedded_store
from tests.gateway.queues.test_push_scheduler import _config

STORED = [b"p0-0", b"p0-1", b"p0-2", b"p1-0", b"p1-1", b"p1-2"]  # partition, then number


class SecondReadHeld:
    """Reads of partition 1 wait until released, then answer or raise what they are given."""

    def __init__(self, store: EmbeddedStore) -> None:
        self._read = store.read
        self.waiting = anyio.Event()
        self.release = anyio.Event()
        self.error: Exception | None = None
        store.read = self.read  # type: ignore[method-assign]

    async def read(self, queue_id: int, partition: int, *args: Any, **kw: Any) -> ReadResult:
        if partition == 1:
            self.waiting.set()
            await self.release.wait()
            if self.error is not None:
                raise self.error
        return await self._read(queue_id, partition, *args, **kw)


async def _two_partitions(tmp_path: Path, store: EmbeddedStore) -> QueueRuntime:
    vhost = VirtualHost("/", LocalMetadataStore(tmp_path / "meta"), store, PushScheduler(64), 2)
    await vhost.load()
    queue = await vhost.declare_queue(QueueDef(vhost="/", name="q", partitions=2), False, "c")
    assert queue.partitions == 2
    records = [Record(b"", b"q", b"", body, ((queue.queue_id, int(body[1:2])),)) for body in STORED]
    await store.append(records, wait_durable=True)
    queue.exhausted = queue.fed = False
    return queue


def test_a_commit_while_the_next_partition_is_read_stays_below_the_first(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with open_embedded_store(_config(tmp_path / "store")) as store:
            queue = await _two_partitions(tmp_path, store)
            reads = SecondReadHeld(store)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(queue.fill)
                await reads.waiting.wait()
                # Partition 0 has been read; its three messages are not in the buffer yet.
                assert queue.held_count() == 0
                assert queue.committed_offsets() == [0, 0]
                reads.release.set()
            assert sorted(bytes(m.body) for _, m in queue.held()) == STORED
            assert queue.committed_offsets() == [0, 0]  # buffered, not delivered

    anyio.run(scenario)


def test_a_fill_whose_second_read_fails_reads_the_first_again(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with open_embedded_store(_config(tmp_path / "store")) as store:
            queue = await _two_partitions(tmp_path, store)
            reads = SecondReadHeld(store)
            reads.error = StoreError("broker away")
            reads.release.set()
            with pytest.raises(StoreError):
                await queue.fill()
            assert queue.cursors == [0, 0]
            reads.error = None
            await queue.fill()
            assert sorted(bytes(m.body) for _, m in queue.held()) == STORED

    anyio.run(scenario)
