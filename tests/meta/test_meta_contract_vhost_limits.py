"""The MetadataStore contract, vhost limits (meta.vhost_limits): stored and read back after a
reopen, announced on the change feed, dropped with their vhost; max-queues refuses a new queue
with RabbitMQ's text (two handles racing for the last place: one wins); connections are
counted per vhost over every handle, against the limit the caller passes."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import anyio
import pytest

from meta.errors import NotAllowed, PreconditionFailed
from meta.local_store import LocalMetadataStore
from meta.models import VHost, VHostLimits
from meta.store import MetadataStore
from tests.meta.builders import changes_until, qdef
from tests.meta.contract import Stores

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend(combo: tuple[str, str]) -> str:
    return combo[1]


async def test_limits_are_kept_read_back_and_replaced_whole(stores: Stores, tmp_path: Path) -> None:
    store = stores.main
    await store.add_vhost(VHost(name="v"))
    assert await store.get_vhost_limits("v") is None
    await store.set_vhost_limits(VHostLimits(vhost="v", limits={"max-queues": 5}))
    both = VHostLimits(vhost="v", limits={"max-connections": 2, "max-queues": -1})
    await store.set_vhost_limits(both)
    await store.set_vhost_limits(VHostLimits(vhost="/", limits={}))
    reopened: MetadataStore = (
        stores.peer() if stores.kind == "redis" else LocalMetadataStore(tmp_path / "main")
    )
    try:
        assert await reopened.get_vhost_limits("v") == both
        assert await reopened.list_vhost_limits() == [VHostLimits(vhost="/"), both]
    finally:
        if stores.kind == "local":
            await reopened.close()


async def test_limits_of_a_missing_vhost_are_refused(store: MetadataStore) -> None:
    with pytest.raises(NotAllowed, match="vhost nowhere not found"):
        await store.set_vhost_limits(VHostLimits(vhost="nowhere", limits={"max-queues": 1}))


async def test_changes_are_followed_and_limits_go_with_their_vhost(stores: Stores) -> None:
    store, peer = stores.main, stores.peer()
    await store.add_vhost(VHost(name="v"))
    limits = VHostLimits(vhost="v", limits={"max-queues": 1})
    position = await peer.change_position()
    async with aclosing(peer.follow(position)) as feed:
        await store.set_vhost_limits(limits)
        await store.delete_vhost("v")
        seen = await changes_until(feed, ("vhost.deleted", "v"))
    kinds = [(c.kind, c.vhost) for c in seen if not c.kind.startswith("exchange.")]
    assert kinds == [
        ("vhost_limits.set", "v"),
        ("vhost_limits.cleared", "v"),
        ("vhost.deleted", "v"),
    ]
    assert seen[0].entity() == limits
    await store.add_vhost(VHost(name="v"))  # a new vhost of that name has no limits
    assert await store.get_vhost_limits("v") is None
    await store.declare_queue(qdef("a", vhost="v"))
    await store.declare_queue(qdef("b", vhost="v"))


async def test_max_queues_refuses_new_queues_only(store: MetadataStore) -> None:
    await store.add_vhost(VHost(name="v"))
    await store.declare_queue(qdef("a", vhost="v"))
    await store.set_vhost_limits(VHostLimits(vhost="v", limits={"max-queues": 2}))
    await store.declare_queue(qdef("b", vhost="v"))
    await store.declare_queue(qdef("a", vhost="v"))  # redeclared: no new queue
    await store.declare_queue(qdef("a", vhost="v"), passive=True)
    text = "cannot declare queue 'c': queue limit in vhost 'v' (2) is reached"
    with pytest.raises(PreconditionFailed) as refused:
        await store.declare_queue(qdef("c", vhost="v"))
    assert refused.value.detail == text
    with pytest.raises(PreconditionFailed, match=r"^cannot declare queue 'amq\.gen-"):
        await store.declare_queue(qdef("", vhost="v"))
    await store.declare_queue(qdef("c"))  # another vhost is not limited
    # Lowered below the count: what exists stays; raised or -1: room again.
    await store.set_vhost_limits(VHostLimits(vhost="v", limits={"max-queues": 0}))
    assert {q.name for q in await store.list_queues("v")} == {"a", "b"}
    with pytest.raises(PreconditionFailed, match=r"\(0\) is reached"):
        await store.declare_queue(qdef("c", vhost="v"))
    await store.set_vhost_limits(VHostLimits(vhost="v", limits={"max-queues": -1}))
    await store.declare_queue(qdef("c", vhost="v"))
    await store.set_vhost_limits(VHostLimits(vhost="v", limits={"max-queues": 4}))
    await store.delete_queue("v", "a")
    await store.declare_queue(qdef("d", vhost="v"))
    await store.declare_queue(qdef("e", vhost="v"))


async def test_two_handles_racing_for_the_last_queue_place_get_one(stores: Stores) -> None:
    store, peer = stores.main, stores.peer()
    await store.add_vhost(VHost(name="v"))
    await store.set_vhost_limits(VHostLimits(vhost="v", limits={"max-queues": 3}))
    refused: list[str] = []

    async def declare(handle: MetadataStore, name: str) -> None:
        try:
            await handle.declare_queue(qdef(name, vhost="v"))
        except PreconditionFailed as error:
            refused.append(error.detail)

    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(declare, store if i % 2 else peer, f"q{i}")
    assert len(await store.list_queues("v")) == 3
    assert len(refused) == 5


async def test_connections_are_counted_against_the_given_limit(stores: Stores) -> None:
    store, peer = stores.main, stores.peer()
    assert await store.open_connection("/", "gw1/1", 2)
    assert await peer.open_connection("/", "gw2/1", 2)
    assert not await store.open_connection("/", "gw1/2", 2)
    assert not await peer.open_connection("/", "gw2/2", 0)
    assert await store.open_connection("/", "gw1/2", None)  # no limit: counted all the same
    assert await store.open_connection("/", "gw1/2", 1)  # already counted: not refused
    assert await peer.count_connections("/") == 3
    await peer.close_connection("/", "gw1/2")
    await store.close_connection("/", "gw1/9")  # unknown: nothing
    assert await store.count_connections("/") == 2
    await store.forget_connections("gw2")  # that gateway is gone
    assert await peer.count_connections("/") == 1
    assert await store.open_connection("/", "gw1/3", 2)
    assert await store.count_connections("other") == 0
