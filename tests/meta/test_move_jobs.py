"""The cluster's move job record on a real Redis (meta/move_jobs.py): one gateway holds the
job's lease at a time, only the holder writes the record, and a lapsed lease is taken over
with the record as its last holder left it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from meta.move_jobs import SharedMoveJob
from meta.redis_store import RedisMetadataStore
from tests.harness.redis_server import RedisServer

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def store(shared_redis: RedisServer) -> AsyncIterator[RedisMetadataStore]:
    opened = RedisMetadataStore(shared_redis.url, prefix=f"t{uuid.uuid4().hex[:10]}:")
    yield opened
    await opened.close()


async def test_one_runner_writes_the_record_and_another_takes_a_lapsed_job_over(
    store: RedisMetadataStore,
) -> None:
    a, b = SharedMoveJob(store, "gw-a", 200), SharedMoveJob(store, "gw-b", 200)
    assert await a.load() is None
    assert await a.claim()
    assert not await b.claim()  # held by gw-a
    assert await a.save('{"next": 1}')
    assert not await b.save('{"next": 0}')  # not the holder: nothing written
    assert await b.load() == '{"next": 1}'
    assert await a.claim()  # renewed
    await asyncio.sleep(0.3)  # gw-a stops renewing: the lease lapses (Redis's clock)
    assert await b.claim()
    assert await b.load() == '{"next": 1}'  # where gw-a left it
    assert not await a.save('{"next": 2}')  # gw-a woke up: fenced off
    assert await b.save('{"next": 2}')
    await a.release()  # not the holder: nothing happens
    assert not await a.claim()
    await b.release()
    racing = [SharedMoveJob(store, f"gw-{i}", 5_000) for i in range(8)]
    results = await asyncio.gather(*(job.claim() for job in racing))
    assert sum(results) == 1  # a free job has exactly one taker
    assert not await a.claim()
