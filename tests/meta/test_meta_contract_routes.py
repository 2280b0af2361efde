"""The MetadataStore contract, versioned routes of keyed-order queues (meta/queue_route.py):
a route is set for an existing queue with that id only, by compare-and-set on the route
stored now (RouteConflict, 409, when another writer came first), and read back after a
reopen; it belongs to its queue, so deleting the queue or its vhost drops it and a queue
declared again under the name has none; sets are announced on the change feed as
``route.set``, and a queue's deletion takes its route without a change of its own (fixtures
and what runs where: tests/meta/contract.py)."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import anyio
import pytest

from meta.errors import NotFound, RouteConflict
from meta.local_store import LocalMetadataStore
from meta.models import VHost
from meta.queue_route import QueueRoute, closed, initial_route, split
from meta.store import MetadataStore
from tests.meta.builders import changes_until, qdef
from tests.meta.contract import Stores

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend(combo: tuple[str, str]) -> str:
    return combo[1]


async def declared_route(store: MetadataStore, name: str, vhost: str = "/") -> QueueRoute:
    """Declare queue ``name`` and return version 1 of its route (not stored yet)."""
    queue = await store.declare_queue(qdef(name, vhost=vhost))
    return initial_route(vhost, name, queue.queue_id, 4, logical=64, at="2026-03-01T10:00:00Z")


def reopen(stores: Stores, tmp_path: Path) -> MetadataStore:
    """Another handle on the metadata as a restart or another gateway sees it."""
    return stores.peer() if stores.kind == "redis" else LocalMetadataStore(tmp_path / "main")


async def test_routes_are_set_and_read_back_after_a_reopen(stores: Stores, tmp_path: Path) -> None:
    store = stores.main
    await store.add_vhost(VHost(name="b"))
    first = await declared_route(store, "orders")
    audit = await declared_route(store, "audit", vhost="b")
    assert await store.get_route("/", "orders") is None
    await store.set_route(first, None)
    assert await store.get_route("/", "orders") == first
    second = split(first, 1, when="2026-03-01T11:00:00Z")
    await store.set_route(second, first)
    third = closed(second, 1, offset=41)  # a partition's state changes the route too
    await store.set_route(third, second)
    await store.set_route(audit, None)
    assert await store.get_route("/", "orders") == third
    assert await store.get_route("b", "orders") is None  # another vhost's queue
    assert await store.get_route("/", "never") is None
    reopened = reopen(stores, tmp_path)
    try:
        got = await reopened.get_route("/", "orders")
        assert got == third
        assert got is not None and got.version == 2 and got.partition(1).closed_at == 41
        assert await reopened.get_route("b", "audit") == audit
    finally:
        if stores.kind == "local":
            await reopened.close()


async def test_a_stale_expected_route_is_refused(store: MetadataStore) -> None:
    first = await declared_route(store, "orders")
    await store.set_route(first, None)
    second = split(first, 0)
    await store.set_route(second, first)
    with pytest.raises(RouteConflict) as refused:  # another writer's split came first
        await store.set_route(split(first, 1), first)
    assert refused.value.reply_code == 409
    assert refused.value.detail == (
        "route of queue 'orders' in vhost '/' changed meanwhile (now version 2)"
    )
    with pytest.raises(RouteConflict):  # a route is there: None is stale
        await store.set_route(first, None)
    with pytest.raises(RouteConflict):  # the same version, yet not the route stored
        await store.set_route(closed(second, 0, offset=7), closed(second, 0, offset=3))
    assert await store.get_route("/", "orders") == second


async def test_of_two_racing_changes_one_is_refused(stores: Stores) -> None:
    store, peer = stores.main, stores.peer()  # Redis: two gateways
    first = await declared_route(store, "orders")
    await store.set_route(first, None)
    changes = [(store, split(first, 0)), (peer, split(first, 1))] * 5
    outcomes: list[str] = []

    async def change(handle: MetadataStore, route: QueueRoute) -> None:
        try:
            await handle.set_route(route, first)
            outcomes.append("set")
        except RouteConflict:
            outcomes.append("refused")

    async with anyio.create_task_group() as tg:
        for handle, route in changes:
            tg.start_soon(change, handle, route)
    assert sorted(outcomes) == ["refused"] * 9 + ["set"]
    stored = await store.get_route("/", "orders")
    assert stored in (split(first, 0), split(first, 1))


async def test_expecting_a_route_where_there_is_none_is_refused(store: MetadataStore) -> None:
    first = await declared_route(store, "orders")
    with pytest.raises(RouteConflict) as refused:
        await store.set_route(split(first, 0), first)
    assert refused.value.detail == (
        "route of queue 'orders' in vhost '/' changed meanwhile (now none)"
    )
    assert await store.get_route("/", "orders") is None


async def test_a_route_needs_its_queue(store: MetadataStore) -> None:
    orders = await declared_route(store, "orders")
    missing = orders.model_copy(update={"queue": "never"})
    with pytest.raises(NotFound) as refused:
        await store.set_route(missing, None)
    assert refused.value.reply_code == 404
    assert refused.value.detail == "no queue 'never' in vhost '/'"
    with pytest.raises(NotFound):
        await store.set_route(orders.model_copy(update={"vhost": "no-such-vhost"}), None)
    with pytest.raises(NotFound):  # the queue is there, but it is not the route's queue
        await store.set_route(orders.model_copy(update={"queue_id": orders.queue_id + 1}), None)
    assert await store.get_route("/", "orders") is None
    assert await store.get_route("/", "never") is None


async def test_a_route_goes_with_its_queue_and_is_not_the_next_ones(
    stores: Stores, tmp_path: Path
) -> None:
    store = stores.main
    old = await declared_route(store, "orders")
    kept = await declared_route(store, "kept")
    await store.set_route(old, None)
    await store.set_route(kept, None)
    await store.delete_queue("/", "orders")
    assert await store.get_route("/", "orders") is None
    new = await declared_route(store, "orders")  # again: a new queue, a new id
    assert new.queue_id != old.queue_id
    assert await store.get_route("/", "orders") is None
    with pytest.raises(NotFound):  # the old queue's route names the old id
        await store.set_route(split(old, 0), old)
    with pytest.raises(RouteConflict):  # what is left of the old route is no route
        await store.set_route(new, old)
    await store.set_route(new, None)  # the new queue's own route
    assert await store.get_route("/", "orders") == new
    assert await store.get_route("/", "kept") == kept
    reopened = reopen(stores, tmp_path)
    try:
        assert await reopened.get_route("/", "orders") == new
        assert await reopened.get_route("/", "kept") == kept
    finally:
        if stores.kind == "local":
            await reopened.close()


async def test_a_route_goes_with_its_vhost(store: MetadataStore) -> None:
    await store.add_vhost(VHost(name="b"))
    in_b = await declared_route(store, "orders", vhost="b")
    orders = await declared_route(store, "orders")
    await store.set_route(in_b, None)
    await store.set_route(orders, None)
    await store.delete_vhost("b")
    assert await store.get_route("b", "orders") is None
    await store.add_vhost(VHost(name="b"))
    again = await declared_route(store, "orders", vhost="b")
    assert await store.get_route("b", "orders") is None
    await store.set_route(again, None)
    assert await store.get_route("b", "orders") == again
    assert await store.get_route("/", "orders") == orders


async def test_route_sets_are_on_the_feed(stores: Stores) -> None:
    store, peer = stores.main, stores.peer()
    first = await declared_route(store, "orders")
    second = split(first, 3)
    position = await peer.change_position()
    async with aclosing(peer.follow(position)) as feed:
        await store.set_route(first, None)
        with pytest.raises(RouteConflict):  # refused: no change
            await store.set_route(second, None)
        await store.set_route(second, first)
        await store.delete_queue("/", "orders")  # takes the route: queue.deleted says it
        seen = await changes_until(feed, ("queue.deleted", "orders"))
    assert [(c.kind, c.vhost, c.name) for c in seen] == [
        ("route.set", "/", "orders"),
        ("route.set", "/", "orders"),
        ("queue.deleted", "/", "orders"),
    ]
    assert [c.entity() for c in seen[:2]] == [first, second]
