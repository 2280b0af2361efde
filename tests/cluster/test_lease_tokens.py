"""Fencing tokens when Redis hands one counter value out twice (nemesis seed 8): a write lost
at a Redis failover, or an old master taking writes before it learns it was replaced. A
broker admits a token equal to the highest it saw (its holder reads again), so two gateways
given one token would both deliver the partition, neither flagging the other's messages.
Tokens carry their owner's tag, and a counter floor moves Redis past what a broker saw."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.queues.runtime import QueueRuntime
from meta.cluster import owner_tag, token_counter
from meta.models import QueueDef
from meta.redis_keys import RedisKeys
from meta.redis_store import RedisMetadataStore
from storage import FlushPolicy, Record, StoreConfig, open_embedded_store
from storage.errors import StaleFence
from storage.log.embedded import EmbeddedStore
from tests.harness.redis_server import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


async def _lose_writes(url: str, prefix: str, name: str, counter: int) -> None:
    """What a promoted replica that missed the last writes holds: no lease, an older
    counter."""
    keys = RedisKeys(prefix)
    client = aioredis.Redis.from_url(url)
    try:
        await client.delete(keys.delivery_lease(name))
        await client.set(keys.lease_tokens(), counter)
    finally:
        await client.aclose()


async def test_two_owners_never_share_a_token(
    meta: RedisMetadataStore, redis_server: RedisServer, prefix: str
) -> None:
    first = await meta.take_lease("q:1:0", "gw-a", 5000)
    assert first.token & 0xFFFF == owner_tag("gw-a")
    await _lose_writes(redis_server.url, prefix, "q:1:0", token_counter(first.token) - 1)
    second = await meta.take_lease("q:1:0", "gw-b", 5000)
    assert token_counter(second.token) == token_counter(first.token)  # the value again
    assert second.token != first.token
    assert second.token & 0xFFFF == owner_tag("gw-b")


async def test_a_floor_moves_the_counter_past_what_a_broker_saw(
    meta: RedisMetadataStore,
) -> None:
    taken = await meta.take_lease("q:1:0", "gw-b", 5000, floor=41)
    assert token_counter(taken.token) == 42
    await meta.drop_lease("q:1:0", "gw-b")
    # The counter stays past the floor; a floor below it changes nothing.
    assert token_counter((await meta.take_lease("q:1:0", "gw-a", 5000, 3)).token) == 43


async def _admitted(store: EmbeddedStore, fence: int) -> bool:
    try:
        await store.read(1, 0, 0, 10, fence=fence)
    except StaleFence:
        return False
    return True


@pytest.mark.parametrize("owners", [("gw-a", "gw-b"), ("gw-b", "gw-a")])
async def test_a_counter_value_given_twice_admits_one_holder_at_the_broker(
    meta: RedisMetadataStore,
    redis_server: RedisServer,
    prefix: str,
    tmp_path: Path,
    owners: tuple[str, str],
) -> None:
    """The first owner takes the partition over; Redis loses the writes; the second gets
    the same counter value and takes over too. The broker admits one of them from then on
    (before, both read on): the higher tag's, the lower one's take-over refused at once."""
    async with open_embedded_store(StoreConfig(tmp_path, flush=FlushPolicy.ASYNC)) as store:
        await store.create_queue(1, 1)
        records = [Record(b"", b"q", b"", b"%d" % n, ((1, 0),)) for n in range(4)]
        await store.append(records, wait_durable=False)
        tokens = []
        for owner in owners:
            lease = await meta.take_lease("q:1:0", owner, 5000)
            tokens.append(lease.token)
            queue = QueueRuntime(QueueDef(vhost="/", name="q", queue_id=1), store)
            await queue.start()
            queue.leases = [False]
            queue.fences[0] = lease.token
            refused = False
            try:
                await queue.take_over(0)
            except StaleFence:
                refused = True
            await _lose_writes(redis_server.url, prefix, "q:1:0", 0)
        assert token_counter(tokens[0]) == token_counter(tokens[1])
        assert refused == (owner_tag(owners[1]) < owner_tag(owners[0]))
        admitted = [await _admitted(store, token) for token in tokens]
        assert admitted == [refused, not refused]
