"""Checkpoints in worker threads while the event loop declares and deletes queues.

The checkpoint wrote the queue registry by iterating the live dict in its thread, which
failed with "dictionary changed size during iteration" under load (and an older registry
could overwrite a newer one). The registry is now snapshotted on the loop.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from storage import LogStore, StoreConfig, open_embedded_store
from storage.log.file_system import FileSystem
from storage.log.state_files import QueueInfo, QueueRegistry
from tests.storage.helpers import rec

BASE_QUEUES = 1500  # enough that writing the registry takes several GIL switch intervals
ROUNDS = 800


@pytest.fixture
def config(small_config: StoreConfig) -> StoreConfig:
    return replace(small_config, segment_size_bytes=1 << 20, max_record_bytes=4096)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.anyio
async def test_declares_and_deletes_during_checkpoints(config: StoreConfig) -> None:
    errors: list[BaseException] = []
    checkpoints = 0
    expected: set[int] = set()
    async with open_embedded_store(config) as store:
        for queue_id in range(1, BASE_QUEUES + 1):
            await store.create_queue(queue_id, 1)
            expected.add(queue_id)
        done = anyio.Event()

        async def checkpoint_forever() -> None:
            nonlocal checkpoints
            while not done.is_set():
                try:
                    await store.checkpoint()
                    checkpoints += 1
                except Exception as error:  # the bug: RuntimeError from the worker thread
                    errors.append(error)
                    return

        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(checkpoint_forever)
            next_id = BASE_QUEUES + 1
            for round_ in range(ROUNDS):
                await store.create_queue(next_id, 1)
                expected.add(next_id)
                next_id += 1
                victim = min(expected)
                await store.delete_queue(victim)
                expected.discard(victim)
                if round_ % 50 == 0:  # an append saves a dirty registry from the loop too
                    await store.append([rec(b"m", (max(expected), 0))], wait_durable=False)
                await anyio.sleep(0)
            done.set()
        assert not errors, errors
        assert checkpoints > 10, "the checkpoints hardly overlapped the declares"
        assert set(await store.queues()) == expected
    # After a clean close and a reopen the registry on disk holds exactly those queues.
    reopened = LogStore.open(config)
    try:
        assert set(reopened.queues()) == expected
    finally:
        reopened.close()


def test_an_older_registry_snapshot_never_overwrites_a_newer_one(tmp_path: Path) -> None:
    path = tmp_path / "queues.json"
    registry = QueueRegistry(FileSystem(), path)
    registry.queues[1] = QueueInfo(1, 1, 0)
    older = registry.snapshot()
    registry.queues[2] = QueueInfo(2, 1, 0)
    newer = registry.snapshot()
    assert registry.write(newer)  # the loop's own save, say
    assert registry.write(older)  # a checkpoint thread that was slower: skipped
    assert set(json.loads(path.read_bytes())["queues"]) == {"1", "2"}
