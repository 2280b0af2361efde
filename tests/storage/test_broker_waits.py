"""READ with ``wait_ms`` on a broker: held while the partition has nothing new, answered as
soon as an append reaches it (or a purge or delete of its queue, or the wait runs out),
many at once per connection without holding anything else up."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from storage import (
    QUEUE_GROUP,
    ReadStatus,
    Record,
    StoreConfig,
    UnknownQueue,
    connect_remote_store,
    open_embedded_store,
)
from tests.storage.remote_helpers import served

pytestmark = [
    pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"]),
    pytest.mark.anyio,
]


def rec(body: bytes, queue_id: int, partition: int = 0) -> Record:
    return Record(b"", b"k", b"", body, ((queue_id, partition),), born_ts_ms=1, flags=0)


async def test_held_reads_answer_on_append_purge_delete_and_timeout(tmp_path: Path) -> None:
    config = StoreConfig(tmp_path / "store")
    async with (
        open_embedded_store(config) as embedded,
        served(embedded) as address,
        connect_remote_store(address) as store,
    ):
        for queue_id in (1, 2, 3):
            await store.create_queue(queue_id, 2)
        answers: dict[str, tuple[float, object]] = {}

        async def held(name: str, queue_id: int, partition: int, wait_ms: int) -> None:
            started = anyio.current_time()
            try:
                value: object = await store.read(queue_id, partition, 0, 10, wait_ms=wait_ms)
            except UnknownQueue as error:
                value = error
            answers[name] = (anyio.current_time() - started, value)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(held, "append", 1, 1, 5000)
                tg.start_soon(held, "other partition", 1, 0, 300)
                tg.start_soon(held, "purge", 2, 0, 5000)
                tg.start_soon(held, "delete", 3, 0, 5000)
                for n in range(200):  # many held on one connection
                    tg.start_soon(held, f"many {n}", 1, 1, 5000)
                await anyio.sleep(0.2)
                assert not answers  # all held
                started = anyio.current_time()  # meanwhile other calls are answered at once
                assert (await store.queue_stats(1)).ready == 0
                assert (await store.read(1, 1, 0)).status is ReadStatus.NO_NEW_MESSAGE
                assert anyio.current_time() - started < 1.0  # not behind the 5 s holds
                await store.append([rec(b"x", 1, 1)])
                await store.purge(2)
                await store.delete_queue(3)
        elapsed, found = answers["append"]
        assert elapsed < 1.0 and [bytes(m.body) for m in found.messages] == [b"x"]  # type: ignore[attr-defined]
        assert all(bytes(answers[f"many {n}"][1].messages[0].body) == b"x" for n in range(200))  # type: ignore[attr-defined]
        elapsed, found = answers["other partition"]  # nothing reached it: the wait ran out
        assert 0.25 < elapsed < 1.0 and found.status is ReadStatus.NO_NEW_MESSAGE  # type: ignore[attr-defined]
        assert answers["purge"][0] < 1.0
        assert answers["delete"][0] < 1.0 and isinstance(answers["delete"][1], UnknownQueue)
        # An offset with messages already there: answered at once, as without wait_ms.
        assert len((await store.read(1, 1, 0, wait_ms=5000)).messages) == 1
        await store.commit_offset(QUEUE_GROUP, 1, 1, 1)


async def test_a_held_read_ends_with_its_connection(tmp_path: Path) -> None:
    config = StoreConfig(tmp_path / "store")
    async with open_embedded_store(config) as embedded, served(embedded) as address:
        async with connect_remote_store(address) as store:
            await store.create_queue(1, 1)
            async with anyio.create_task_group() as tg:
                tg.start_soon(store.read, 1, 0, 0, 10, 1 << 20, 60_000)
                await anyio.sleep(0.1)
                tg.cancel_scope.cancel()
        # The client went with its read in flight; the broker still serves a new client.
        async with connect_remote_store(address) as again:
            with anyio.fail_after(2):
                await again.append([rec(b"y", 1)])
                assert len((await again.read(1, 0, 0, wait_ms=1000)).messages) == 1
