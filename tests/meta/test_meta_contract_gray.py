"""The MetadataStore contract, gray release rules (gateway/features/gray.py): created,
replaced, read back after a reopen, deleted once; every change announced on the change feed
as ``gray_rule.set`` / ``gray_rule.deleted`` and seen by another handle (fixtures and what
runs where: tests/meta/contract.py)."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import pytest

from meta.local_store import LocalMetadataStore
from meta.models import GrayMatch, GrayRule
from meta.store import MetadataStore
from tests.meta.builders import changes_until
from tests.meta.contract import Stores

pytestmark = pytest.mark.anyio

CANARY = GrayRule(
    name="canary",
    match=GrayMatch(connection_name="billing-canary-*", address="10.1.0.0/16"),
    set_at="2026-03-01T10:00:00Z",
)


@pytest.fixture
def anyio_backend(combo: tuple[str, str]) -> str:
    return combo[1]


async def test_rules_are_kept_replaced_and_read_back_after_a_reopen(
    stores: Stores, tmp_path: Path
) -> None:
    store = stores.main
    assert await store.list_gray_rules() == []
    assert await store.get_gray_rule("canary") is None
    await store.set_gray_rule(CANARY)
    replaced = CANARY.model_copy(update={"gray": False, "drain": True, "switch": False})
    await store.set_gray_rule(replaced)
    alice = GrayRule(name="alice", match=GrayMatch(user="alice"), set_at="2026-03-02T10:00:00Z")
    await store.set_gray_rule(alice)
    reopened: MetadataStore = (
        stores.peer() if stores.kind == "redis" else LocalMetadataStore(tmp_path / "main")
    )
    try:
        assert await reopened.get_gray_rule("canary") == replaced
        assert await reopened.list_gray_rules() == [alice, replaced]  # by name
    finally:
        if stores.kind == "local":
            await reopened.close()


async def test_a_rule_is_deleted_once(store: MetadataStore) -> None:
    await store.set_gray_rule(CANARY)
    assert await store.delete_gray_rule("canary")
    assert not await store.delete_gray_rule("canary")
    assert not await store.delete_gray_rule("never")
    assert await store.get_gray_rule("canary") is None
    assert await store.list_gray_rules() == []


async def test_changes_are_seen_by_another_handle(stores: Stores) -> None:
    store, peer = stores.main, stores.peer()
    replaced = CANARY.model_copy(update={"gray": False})
    position = await peer.change_position()
    async with aclosing(peer.follow(position)) as feed:
        await store.set_gray_rule(CANARY)
        await store.set_gray_rule(replaced)
        assert not await store.delete_gray_rule("never")  # no change for nothing deleted
        await store.delete_gray_rule("canary")
        seen = await changes_until(feed, ("gray_rule.deleted", "canary"))
    assert [(c.kind, c.vhost, c.name) for c in seen] == [
        ("gray_rule.set", "", "canary"),
        ("gray_rule.set", "", "canary"),
        ("gray_rule.deleted", "", "canary"),
    ]
    assert [c.entity() for c in seen] == [CANARY, replaced, replaced]
