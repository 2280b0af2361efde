"""What only the Redis store has: races between gateways, Redis going away and coming back,
restarts seen by followers, gateway leases, the broker registry and queue placement.

Real redis-server processes (tests/harness/redis_server.py); asyncio only, as the store.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

import pytest
import trio

from meta.change_feed import Change, Reload
from meta.cluster import spread_partitions
from meta.errors import MetadataUnavailable, NotFound, PreconditionFailed
from meta.models import ExchangeDef, QueueDef
from meta.redis_conn import AsyncioRequired
from meta.redis_store import RedisMetadataStore
from tests.harness.redis_server import RedisServer
from tests.harness.waiting import eventually
from tests.meta.builders import next_events, qbind, qdef, xdef

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def open_store(
    shared_redis: RedisServer,
) -> AsyncIterator[Callable[..., RedisMetadataStore]]:
    """``open_store(server=None, prefix=None, **options)``: a store (a client of its own);
    stores opened by one test share a prefix unless told otherwise."""
    opened: list[RedisMetadataStore] = []
    prefix = f"t{uuid.uuid4().hex[:10]}:"

    def open_store(server: RedisServer | None = None, **options: Any) -> RedisMetadataStore:
        options.setdefault("prefix", prefix)
        store = RedisMetadataStore((server or shared_redis).url, **options)
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        await store.close()


# --- two gateways at once ----------------------------------------------------------


async def test_concurrent_declares_with_different_arguments_one_wins(
    open_store: Callable[..., RedisMetadataStore],
) -> None:
    a, b = open_store(), open_store()
    for round_ in range(50):
        name = f"race-{round_}"
        results = await asyncio.gather(
            a.declare_queue(qdef(name, arguments={"x-max-length": 1})),
            b.declare_queue(qdef(name, arguments={"x-max-length": 2})),
            return_exceptions=True,
        )
        won = [r for r in results if isinstance(r, QueueDef)]
        lost = [r for r in results if isinstance(r, PreconditionFailed)]
        assert len(won) == 1 and len(lost) == 1, results
        assert lost[0].reply_code == 406 and "inequivalent arg 'x-max-length'" in lost[0].detail
        assert await b.get_queue("/", name) == won[0]
    # Both declares were in flight together: some rounds had to be retried after WATCH.
    assert a.transaction_conflicts + b.transaction_conflicts > 0
    for round_ in range(50):
        name = f"xrace-{round_}"
        outcomes = await asyncio.gather(
            a.declare_exchange(xdef(name, "direct")),
            b.declare_exchange(xdef(name, "fanout")),
            return_exceptions=True,
        )
        assert sorted(type(r).__name__ for r in outcomes) == ["ExchangeDef", "PreconditionFailed"]
        stored = await a.get_exchange("/", name)
        assert stored in outcomes and isinstance(stored, ExchangeDef)


async def test_concurrent_equal_declares_and_binds_agree(
    open_store: Callable[..., RedisMetadataStore],
) -> None:
    stores = [open_store() for _ in range(4)]
    queues = await asyncio.gather(*(s.declare_queue(qdef("same")) for s in stores))
    assert len({q.queue_id for q in queues}) == 1
    created = await asyncio.gather(*(s.bind(qbind("amq.direct", "same", "k")) for s in stores))
    assert sorted(created) == [False, False, False, True]  # HSETNX settles the race
    assert len(await stores[0].bindings_for("/", "amq.direct")) == 1


async def test_binds_racing_a_queue_delete_leave_no_dangling_binding(
    open_store: Callable[..., RedisMetadataStore],
) -> None:
    a, b = open_store(), open_store()
    for round_ in range(20):
        name = f"gone-{round_}"
        await a.declare_queue(qdef(name))
        await asyncio.gather(
            a.delete_queue("/", name),
            b.bind(qbind("amq.topic", name, "k")),
            return_exceptions=True,
        )
        assert await a.get_queue("/", name) is None
        assert [x for x in await a.bindings_for("/", "amq.topic") if x.destination == name] == []


# --- Redis unavailable -----------------------------------------------------------


async def test_unavailable_redis_fails_within_the_bound_and_recovers(
    open_store: Callable[..., RedisMetadataStore], own_redis: RedisServer
) -> None:
    store = open_store(own_redis, unavailable_timeout_s=1.0)
    await store.declare_queue(qdef("kept"))
    own_redis.stop(signal.SIGTERM)
    for call in (store.get_queue("/", "kept"), store.declare_queue(qdef("new"))):
        started = time.monotonic()
        with pytest.raises(MetadataUnavailable) as info:
            await call
        elapsed = time.monotonic() - started
        assert 0.9 <= elapsed <= 2.5
        assert info.value.reply_code == 405
        assert f"Redis is unreachable at redis://127.0.0.1:{own_redis.port}/0" in info.value.detail
    own_redis.start()
    assert await store.get_queue("/", "kept") is not None  # the same store, reconnected
    assert (await store.declare_queue(qdef("new"))).name == "new"


async def test_construction_under_trio_is_refused() -> None:
    async def construct() -> None:
        with pytest.raises(AsyncioRequired, match="asyncio only"):
            RedisMetadataStore("redis://127.0.0.1:1/0")

    await asyncio.to_thread(trio.run, construct)


# --- change feed across restarts -------------------------------------------------


async def test_a_follower_reloads_after_a_redis_restart(
    open_store: Callable[..., RedisMetadataStore], own_redis: RedisServer
) -> None:
    store, peer = open_store(own_redis), open_store(own_redis)
    position = await peer.change_position()
    async with aclosing(peer.follow(position)) as feed:
        await store.declare_queue(qdef("q1"))
        (seen,) = await next_events(feed, 1)
        assert isinstance(seen, Change) and seen.name == "q1"
        own_redis.restart()
        (reload,) = await next_events(feed, 1, timeout_s=5)
        assert isinstance(reload, Reload) and "restarted" in reload.reason
        assert await peer.get_queue("/", "q1") is not None  # the AOF kept it
        await store.declare_queue(qdef("q2"))
        (after,) = await next_events(feed, 1)
    assert isinstance(after, Change) and after.name == "q2"


async def test_a_follower_reloads_when_redis_lost_the_feed(
    open_store: Callable[..., RedisMetadataStore],
) -> None:
    store = open_store()
    await store.declare_queue(qdef("q"))
    position = await store.change_position()
    await store._conn.client.delete(store._keys.changes)  # as after FLUSHALL
    async with aclosing(store.follow(position)) as feed:
        (event,) = await next_events(feed, 1)
    assert isinstance(event, Reload) and "gone" in event.reason


# --- gateway leases --------------------------------------------------------------


async def test_a_lapsed_gateway_is_reaped_and_a_live_one_is_not(
    open_store: Callable[..., RedisMetadataStore],
) -> None:
    store, reaper = open_store(), open_store()
    await store.register_gateway("gw-a", ttl_ms=1500)
    await store.register_gateway("gw-b", ttl_ms=30_000)
    await store.declare_queue(qdef("a1", exclusive_owner="gw-a/1"))
    await store.declare_queue(qdef("a2", exclusive_owner="gw-a/2"))
    await store.bind(qbind("amq.direct", "a2", "k"), connection_id="gw-a/2")
    await store.declare_queue(qdef("b1", exclusive_owner="gw-b/1"))
    await store.declare_queue(qdef("ab", exclusive_owner="gw-ab/1"))  # a prefix, not gw-a
    assert await reaper.live_gateways() == ["gw-a", "gw-b"]
    assert await store.renew_gateway("gw-a", ttl_ms=1500)
    assert not await reaper.reap_gateway("gw-b")  # live: left alone

    async def lapsed() -> bool:
        return await reaper.lapsed_gateways() == ["gw-a"]

    await eventually(5, lapsed, "the lease lapsed")
    assert await reaper.live_gateways() == ["gw-b"]
    assert not await store.renew_gateway("gw-a", ttl_ms=300)  # too late: it must re-register
    deleted = await reaper.reap_gateway("gw-a")
    assert sorted(q.name for q in deleted.queues) == ["a1", "a2"]
    assert [b.routing_key for b in deleted.bindings] == ["k"]
    assert {q.name for q in await reaper.list_queues("/")} == {"b1", "ab"}
    assert await reaper.lapsed_gateways() == []
    forced = await reaper.reap_gateway("gw-b", force=True)  # a clean shutdown
    assert [q.name for q in forced.queues] == ["b1"]
    assert await reaper.live_gateways() == []


# --- broker registry -------------------------------------------------------------


async def test_broker_heartbeats_and_lapses(open_store: Callable[..., RedisMetadataStore]) -> None:
    store = open_store()
    await store.register_broker("g1", "b1", "127.0.0.1:7001", ttl_ms=1000)
    await store.register_broker("g2", "b1", "127.0.0.1:7002", ttl_ms=30_000)
    (first, other) = await store.list_brokers()
    assert (first.group, first.broker_id, first.address, first.alive) == (
        "g1",
        "b1",
        "127.0.0.1:7001",
        True,
    )
    assert other.group == "g2" and other.alive

    async def g1_lapsed() -> bool:
        return not (await store.list_brokers())[0].alive

    await eventually(5, g1_lapsed, "g1 lapsed")
    await store.register_broker("g1", "b1", "127.0.0.1:7011", ttl_ms=300)  # back, moved
    again = (await store.list_brokers())[0]
    assert again.alive and again.address == "127.0.0.1:7011"
    assert again.last_seen_ms > first.last_seen_ms


# --- placement -------------------------------------------------------------------


def test_spread_takes_the_emptiest_group_first() -> None:
    assert spread_partitions(4, ["g2", "g1", "g3"], {}) == ["g1", "g2", "g3", "g1"]
    assert spread_partitions(2, ["g1", "g2", "g3"], {"g1": 2, "g2": 1, "g3": 1}) == ["g2", "g3"]
    with pytest.raises(ValueError):
        spread_partitions(1, [], {})


async def test_placement_spreads_is_stable_and_goes_with_the_queue(
    open_store: Callable[..., RedisMetadataStore],
) -> None:
    store, peer = open_store(), open_store()
    groups = ["g1", "g2", "g3"]
    for name in ("q1", "q2", "q3"):
        await store.declare_queue(qdef(name))
    assert await store.place_queue("/", "q1", 4, groups) == ["g1", "g2", "g3", "g1"]
    assert await store.place_queue("/", "q2", 2, groups) == ["g2", "g3"]
    # Asked again, with other groups even: the first answer stands.
    assert await peer.place_queue("/", "q1", 1, ["g9"]) == ["g1", "g2", "g3", "g1"]
    assert await peer.queue_placement("/", "q2") == ["g2", "g3"]
    racing = await asyncio.gather(*(s.place_queue("/", "q3", 3, groups) for s in (store, peer)))
    assert racing[0] == racing[1] and sorted(racing[0]) == groups
    await store.delete_queue("/", "q1")
    assert await store.queue_placement("/", "q1") is None
    await store.declare_queue(qdef("q4"))
    # q1's four partitions were given back: g1 holds 1 (q3), g2 2, g3 2.
    assert await store.place_queue("/", "q4", 1, groups) == ["g1"]
    with pytest.raises(NotFound):
        await store.place_queue("/", "missing", 1, groups)


async def test_a_placement_grows_but_never_changes_what_is_placed(
    open_store: Callable[..., RedisMetadataStore],
) -> None:
    store, peer = open_store(), open_store()
    await store.declare_queue(qdef("keyed"))
    assert await store.place_queue("/", "keyed", 2, ["g1", "g2"]) == ["g1", "g2"]
    # A split adds partition 2 on g1; a racing writer's other choice for it loses.
    assert await store.extend_placement("/", "keyed", ["g1", "g2", "g1"]) == ["g1", "g2", "g1"]
    assert await peer.extend_placement("/", "keyed", ["g9", "g9", "g2"]) == ["g1", "g2", "g1"]
    assert await peer.extend_placement("/", "keyed", ["g9", "g9", "g9", "g2"]) == [
        "g1", "g2", "g1", "g2"
    ]  # fmt: skip
    assert await store.queue_placement("/", "keyed") == ["g1", "g2", "g1", "g2"]
    await store.declare_queue(qdef("next"))
    # The added partitions count in the load: g1 and g2 hold 2 each, so either goes first.
    assert (await store.place_queue("/", "next", 2, ["g1", "g2", "g3"]))[0] == "g3"
    with pytest.raises(NotFound):
        await store.extend_placement("/", "missing", ["g1"])


# --- delivery leases -----------------------------------------------------------------


async def test_a_delivery_lease_has_one_holder_and_a_new_token_per_holder(
    open_store: Callable[..., RedisMetadataStore],
) -> None:
    a, b = open_store(), open_store()
    first = await a.hold_lease("q:7:0", "gw-a", 300)
    assert first is not None
    assert await b.hold_lease("q:7:0", "gw-b", 300) is None  # held: refused
    assert await a.hold_lease("q:7:0", "gw-a", 300) == first  # renewed, same token
    results = await asyncio.gather(*(b.hold_lease("q:8:0", f"gw-{i}", 300) for i in range(8)))
    assert sum(r is not None for r in results) == 1  # a race has exactly one winner
    await a.drop_lease("q:7:0", "gw-b")  # not the holder: nothing happens
    assert await b.hold_lease("q:7:0", "gw-b", 300) is None
    await a.drop_lease("q:7:0", "gw-a")
    taken = await b.hold_lease("q:7:0", "gw-b", 200)
    assert taken is not None and taken > first  # fencing: a later holder, a larger token
    await asyncio.sleep(0.3)  # lapses without renewal (Redis's clock)
    again = await a.hold_lease("q:7:0", "gw-a", 300)
    assert again is not None and again > taken
