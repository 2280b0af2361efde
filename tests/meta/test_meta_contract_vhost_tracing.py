"""The MetadataStore contract, vhost updates: the firehose's ``tracing`` flag (and the
description and tags a PUT /api/vhosts/{name} replaces) is stored, read back after a
reopen, and announced on the change feed so other gateways switch their firehose too."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import pytest

from meta.errors import NotAllowed
from meta.local_store import LocalMetadataStore
from meta.models import VHost
from meta.store import MetadataStore
from tests.meta.builders import changes_until
from tests.meta.contract import Stores

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend(combo: tuple[str, str]) -> str:
    return combo[1]


async def test_update_replaces_the_vhost_and_a_reopened_store_reads_it(
    stores: Stores, tmp_path: Path
) -> None:
    store = stores.main
    await store.add_vhost(VHost(name="v", description="first", tags=("a",)))
    traced = VHost(name="v", description="second", tracing=True)
    await store.update_vhost(traced)
    assert await store.get_vhost("v") == traced
    assert traced in await store.list_vhosts()
    # Another gateway's handle (Redis), or the embedded node after a restart (local file).
    reopened: MetadataStore = (
        stores.peer() if stores.kind == "redis" else LocalMetadataStore(tmp_path / "main")
    )
    try:
        assert await reopened.get_vhost("v") == traced
        assert (await reopened.get_vhost("/")) == VHost(name="/")  # others untouched
    finally:
        if stores.kind == "local":
            await reopened.close()


async def test_updating_a_missing_vhost_is_refused(store: MetadataStore) -> None:
    with pytest.raises(NotAllowed, match="vhost nowhere not found"):
        await store.update_vhost(VHost(name="nowhere", tracing=True))
    assert await store.get_vhost("nowhere") is None


async def test_a_follower_sees_each_real_update_once(stores: Stores) -> None:
    store, peer = stores.main, stores.peer()
    await store.add_vhost(VHost(name="v"))
    position = await peer.change_position()
    async with aclosing(peer.follow(position)) as feed:
        await store.update_vhost(VHost(name="v", tracing=True))
        await store.update_vhost(VHost(name="v", tracing=True))  # no change: nothing new
        await store.update_vhost(VHost(name="v"))
        await store.add_vhost(VHost(name="end"))
        seen = await changes_until(feed, ("vhost.added", "end"))
    assert [(c.kind, c.vhost, c.name) for c in seen] == [
        ("vhost.updated", "v", "v"),
        ("vhost.updated", "v", "v"),
        ("vhost.added", "end", "end"),
    ]
    assert [c.entity() for c in seen[:2]] == [VHost(name="v", tracing=True), VHost(name="v")]


async def test_a_vhost_created_traced_carries_the_flag_in_its_added_change(
    stores: Stores,
) -> None:
    store, peer = stores.main, stores.peer()
    position = await peer.change_position()
    async with aclosing(peer.follow(position)) as feed:
        await store.add_vhost(VHost(name="t", tracing=True))
        seen = await changes_until(feed, ("vhost.added", "t"))
    assert seen[-1].entity() == VHost(name="t", tracing=True)
    assert await store.get_vhost("t") == VHost(name="t", tracing=True)
