from __future__ import annotations

import json
from dataclasses import replace

import anyio
import pytest

from storage import FlushPolicy, StoreConfig, StoreWriteError, open_embedded_store
from tests.storage.conftest import FaultyFileSystem
from tests.storage.helpers import bodies, rec

pytestmark = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])


@pytest.fixture
def config(small_config: StoreConfig) -> StoreConfig:
    return replace(small_config, segment_size_bytes=1 << 20, max_record_bytes=4096)


@pytest.mark.anyio
async def test_sync_flush_group_commits_concurrent_appends(config: StoreConfig) -> None:
    async with open_embedded_store(config) as store:
        await store.create_queue(1, 1)
        done: list[int] = []

        async def publisher(n: int) -> None:
            for i in range(20):
                result = await store.append([rec(b"%d-%d" % (n, i), (1, 0))])
                # Completion means durable: the fsync covering this record has finished.
                assert store.log.durable_offset >= result.end_offset
                done.append(n)

        async with anyio.create_task_group() as tg:
            for n in range(50):
                tg.start_soon(publisher, n)
        assert len(done) == 1000
        # 1000 appends, far fewer fsyncs: they were shared.
        assert 0 < store.committer.fsyncs < 500
        assert len((await store.read(1, 0, 0, max_count=2000)).messages) == 1000


@pytest.mark.anyio
async def test_async_flush_completes_before_fsync_and_syncs_on_interval(
    config: StoreConfig,
) -> None:
    config = replace(config, flush=FlushPolicy.ASYNC, async_flush_interval_ms=20)
    async with open_embedded_store(config) as store:
        await store.create_queue(1, 1)
        result = await store.append([rec(b"x", (1, 0))])
        assert store.log.durable_offset < result.end_offset
        with anyio.fail_after(5):
            while store.log.durable_offset < result.end_offset:
                await anyio.sleep(0.01)


@pytest.mark.anyio
async def test_failed_fsync_fails_the_append_and_every_later_one(config: StoreConfig) -> None:
    fs = FaultyFileSystem()
    async with open_embedded_store(config, fs) as store:
        await store.create_queue(1, 1)
        await store.append([rec(b"ok", (1, 0))])
        fs.fail_fsync = True
        with pytest.raises(StoreWriteError):
            await store.append([rec(b"unsure", (1, 0))])
        fs.fail_fsync = False
        with pytest.raises(StoreWriteError, match="failed an fsync"):
            await store.append([rec(b"later", (1, 0))])


@pytest.mark.anyio
async def test_offsets_are_persisted_on_an_interval_without_shutdown(config: StoreConfig) -> None:
    config = replace(config, offset_persist_interval_ms=20)
    path = config.data_dir / "offsets.json"
    async with open_embedded_store(config) as store:
        await store.create_queue(3, 1)
        await store.append([rec(b"x", (3, 0)) for _ in range(5)])
        await store.commit_offset("g", 3, 0, 4)
        with anyio.fail_after(5):
            while not path.exists() or b'"3/0":4' not in path.read_bytes():
                await anyio.sleep(0.01)
        assert json.loads(path.read_bytes()) == {"groups": {"g": {"3/0": 4}}}
    async with open_embedded_store(config) as store:
        assert await store.committed_offset("g", 3, 0) == 4
        assert bodies((await store.read(3, 0, 4)).messages) == [b"x"]
