"""The MetadataStore contract, queues whose gray release ended (``mqgw ctl gray end``): an
end is set for an existing queue only, replaced, read back after a reopen, deleted once;
it belongs to its queue, so deleting the queue or its vhost drops it and a queue declared
again under the name has none; sets and deletes are announced on the change feed as
``gray_end.set`` / ``gray_end.deleted``, and a queue's deletion takes its end without a
change of its own (fixtures and what runs where: tests/meta/contract.py)."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import pytest

from meta.errors import NotFound
from meta.local_store import LocalMetadataStore
from meta.models import GrayEnd, VHost
from meta.store import MetadataStore
from tests.meta.builders import changes_until, qdef
from tests.meta.contract import Stores

pytestmark = pytest.mark.anyio

ORDERS = GrayEnd(vhost="/", queue="orders", ends={0: 12, 3: 7}, set_at="2026-03-01T10:00:00Z")


@pytest.fixture
def anyio_backend(combo: tuple[str, str]) -> str:
    return combo[1]


async def test_ends_are_kept_replaced_and_read_back_after_a_reopen(
    stores: Stores, tmp_path: Path
) -> None:
    store = stores.main
    await store.add_vhost(VHost(name="b"))
    await store.declare_queue(qdef("orders", partitions=4))
    await store.declare_queue(qdef("audit", vhost="b", partitions=4))
    assert await store.list_gray_ends() == []
    assert await store.get_gray_end("/", "orders") is None
    await store.set_gray_end(ORDERS)
    replaced = ORDERS.model_copy(update={"ends": {0: 15}, "set_at": "2026-03-01T11:00:00Z"})
    await store.set_gray_end(replaced)
    audit = GrayEnd(vhost="b", queue="audit", ends={1: 0}, set_at="2026-03-02T10:00:00Z")
    await store.set_gray_end(audit)
    assert await store.get_gray_end("/", "orders") == replaced
    assert await store.get_gray_end("b", "orders") is None  # another vhost's queue
    reopened: MetadataStore = (
        stores.peer() if stores.kind == "redis" else LocalMetadataStore(tmp_path / "main")
    )
    try:
        assert await reopened.get_gray_end("/", "orders") == replaced
        assert await reopened.get_gray_end("b", "audit") == audit
        assert await reopened.list_gray_ends() == [replaced, audit]  # by (vhost, queue)
    finally:
        if stores.kind == "local":
            await reopened.close()


async def test_an_end_needs_its_queue(store: MetadataStore) -> None:
    with pytest.raises(NotFound):
        await store.set_gray_end(ORDERS)
    with pytest.raises(NotFound):
        await store.set_gray_end(ORDERS.model_copy(update={"vhost": "no-such-vhost"}))
    assert await store.list_gray_ends() == []


async def test_an_end_is_deleted_once(store: MetadataStore) -> None:
    await store.declare_queue(qdef("orders", partitions=4))
    await store.set_gray_end(ORDERS)
    assert await store.delete_gray_end("/", "orders")
    assert not await store.delete_gray_end("/", "orders")
    assert not await store.delete_gray_end("/", "never")
    assert await store.get_gray_end("/", "orders") is None
    assert await store.list_gray_ends() == []


async def test_an_end_goes_with_its_queue_and_is_not_the_next_ones(
    stores: Stores, tmp_path: Path
) -> None:
    store = stores.main
    await store.declare_queue(qdef("orders", partitions=4))
    await store.declare_queue(qdef("kept", partitions=4))
    kept = ORDERS.model_copy(update={"queue": "kept"})
    await store.set_gray_end(ORDERS)
    await store.set_gray_end(kept)
    await store.delete_queue("/", "orders")
    assert await store.get_gray_end("/", "orders") is None
    assert await store.list_gray_ends() == [kept]
    await store.declare_queue(qdef("orders", partitions=4))  # again: a new queue
    assert await store.get_gray_end("/", "orders") is None
    assert await store.list_gray_ends() == [kept]
    assert not await store.delete_gray_end("/", "orders")  # it has none to resume
    again = ORDERS.model_copy(update={"ends": {0: 0, 3: 0}})
    await store.set_gray_end(again)  # the new queue's own end
    assert await store.get_gray_end("/", "orders") == again
    reopened: MetadataStore = (
        stores.peer() if stores.kind == "redis" else LocalMetadataStore(tmp_path / "main")
    )
    try:
        assert await reopened.list_gray_ends() == [kept, again]
    finally:
        if stores.kind == "local":
            await reopened.close()


async def test_an_end_goes_with_its_vhost(store: MetadataStore) -> None:
    await store.add_vhost(VHost(name="b"))
    await store.declare_queue(qdef("orders", vhost="b", partitions=4))
    await store.declare_queue(qdef("orders", partitions=4))
    in_b = ORDERS.model_copy(update={"vhost": "b"})
    await store.set_gray_end(in_b)
    await store.set_gray_end(ORDERS)
    await store.delete_vhost("b")
    await store.add_vhost(VHost(name="b"))
    await store.declare_queue(qdef("orders", vhost="b", partitions=4))
    assert await store.get_gray_end("b", "orders") is None
    assert await store.list_gray_ends() == [ORDERS]


async def test_changes_are_seen_by_another_handle(stores: Stores) -> None:
    store, peer = stores.main, stores.peer()
    await store.declare_queue(qdef("orders", partitions=4))
    replaced = ORDERS.model_copy(update={"ends": {0: 20, 3: 9}})
    position = await peer.change_position()
    async with aclosing(peer.follow(position)) as feed:
        await store.set_gray_end(ORDERS)
        await store.set_gray_end(replaced)
        assert not await store.delete_gray_end("/", "never")  # no change for nothing deleted
        await store.delete_gray_end("/", "orders")
        await store.set_gray_end(ORDERS)
        await store.delete_queue("/", "orders")  # takes the end: queue.deleted says it
        seen = await changes_until(feed, ("queue.deleted", "orders"))
    assert [(c.kind, c.vhost, c.name) for c in seen] == [
        ("gray_end.set", "/", "orders"),
        ("gray_end.set", "/", "orders"),
        ("gray_end.deleted", "/", "orders"),
        ("gray_end.set", "/", "orders"),
        ("queue.deleted", "/", "orders"),
    ]
    assert [c.entity() for c in seen[:4]] == [ORDERS, replaced, replaced, ORDERS]
