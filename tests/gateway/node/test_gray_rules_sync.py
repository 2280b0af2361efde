"""A gateway's gray registry follows the metadata store (gateway/node/metadata_sync.py): the
``gray_rule.set`` / ``gray_rule.deleted`` changes of the feed are applied to it (again and
again: idempotent), and a reload after a gap in the feed reads the rules whole."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import anyio

from gateway.config.settings import GatewaySettings
from gateway.node import Node
from meta.change_feed import Change
from meta.local_store import LocalMetadataStore
from meta.models import GrayMatch, GrayRule
from storage import FlushPolicy, StoreConfig, open_embedded_store
from tests.meta.builders import changes_until

CANARY = GrayRule(name="canary", match=GrayMatch(connection_name="billing-canary-*"))
ALICE = GrayRule(name="alice", match=GrayMatch(user="alice"), gray=False, drain=True)


def test_feed_changes_and_reloads_reach_the_registry(tmp_path: Path) -> None:
    async def scenario() -> None:
        config = StoreConfig(tmp_path / "store", flush=FlushPolicy.ASYNC)
        async with open_embedded_store(config) as store:
            meta = LocalMetadataStore(tmp_path / "meta")
            await meta.set_gray_rule(ALICE)  # before the start: loaded by it
            node = Node(GatewaySettings.model_validate({"data_dir": tmp_path}), store, meta)
            await node.start()
            assert node.gray.rules == {"alice": ALICE}

            # Changes made elsewhere: the store only (no admin API call updates the node).
            position = await meta.change_position()
            async with aclosing(meta.follow(position)) as feed:
                await meta.set_gray_rule(CANARY)
                replaced = CANARY.model_copy(update={"gray": False})
                await meta.set_gray_rule(replaced)
                await meta.delete_gray_rule("alice")
                seen = await changes_until(feed, ("gray_rule.deleted", "alice"))
            assert node.gray.rules == {"alice": ALICE}  # nothing applied yet
            for change in seen[:2]:
                await node.apply_change(change)
            assert node.gray.rules == {"alice": ALICE, "canary": replaced}
            for change in seen:  # once more: the feed may bring a change again
                await node.apply_change(change)
            assert node.gray.rules == {"canary": replaced}
            await node.apply_change(Change("gray_rule.deleted", "", "never"))

            # A gap: the reload reads what the store has, whatever the registry held.
            await meta.set_gray_rule(ALICE)
            node.gray.rules["stale"] = CANARY.model_copy(update={"name": "stale"})
            await node.reload_metadata()
            assert node.gray.rules == {"alice": ALICE, "canary": replaced}
            await node.shutdown()
            await meta.close()

    anyio.run(scenario)
