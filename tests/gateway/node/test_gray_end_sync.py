"""A gateway follows the queues whose gray release ended (gateway/node/metadata_sync.py):
the ends in the store when it starts, ``gray_end.set`` / ``gray_end.deleted`` from the
change feed (again and again: idempotent), a queue's deletion taking its end along (the feed
has no change of its own for that), and a reload after a gap; each changes the queue's gray
partitions at once."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import anyio

from gateway.config.settings import GatewaySettings
from gateway.node import Node
from gateway.vhost import VirtualHost
from meta.change_feed import Change
from meta.local_store import LocalMetadataStore
from meta.models import GrayEnd, QueueDef
from storage import FlushPolicy, StoreConfig, open_embedded_store
from tests.meta.builders import changes_until

ARGUMENTS = {"x-mqgw-partitions": 4, "x-mqgw-gray-partitions": 2}
ORDERS = QueueDef(vhost="/", name="orders", arguments=ARGUMENTS, partitions=4)
AUDIT = QueueDef(vhost="/", name="audit", arguments=ARGUMENTS, partitions=4)
END = GrayEnd(vhost="/", queue="orders", ends={0: 0, 3: 0}, set_at="2026-03-01T10:00:00Z")


def gray_parts(host: VirtualHost, queue: str) -> tuple[int, ...]:
    return host.queues[queue].gray_parts


def test_start_feed_changes_deletions_and_reloads_reach_the_queue(tmp_path: Path) -> None:
    async def scenario() -> None:
        config = StoreConfig(tmp_path / "store", flush=FlushPolicy.ASYNC)
        async with open_embedded_store(config) as store:
            meta = LocalMetadataStore(tmp_path / "meta")
            await meta.declare_queue(ORDERS)
            await meta.declare_queue(AUDIT)
            await meta.set_gray_end(END)  # before the start: loaded by it
            node = Node(GatewaySettings.model_validate({"data_dir": tmp_path}), store, meta)
            await node.start()
            host = node.vhosts["/"]
            assert node.gray.ends == {("/", "orders"): END}
            assert gray_parts(host, "orders") == ()
            assert gray_parts(host, "audit") == (0, 3)

            # Changes made elsewhere: the store only (no admin API call updates the node).
            audit_end = END.model_copy(update={"queue": "audit"})
            position = await meta.change_position()
            async with aclosing(meta.follow(position)) as feed:
                await meta.delete_gray_end("/", "orders")
                await meta.set_gray_end(audit_end)
                seen = await changes_until(feed, ("gray_end.set", "audit"))
            assert [c.kind for c in seen] == ["gray_end.deleted", "gray_end.set"]
            assert gray_parts(host, "orders") == ()  # nothing applied yet
            for _ in range(2):  # the feed may bring a change again
                for change in seen:
                    await node.apply_change(change)
                assert node.gray.ends == {("/", "audit"): audit_end}
                assert gray_parts(host, "orders") == (0, 3)
                assert gray_parts(host, "audit") == ()
            await node.apply_change(Change("gray_end.deleted", "/", "never"))

            # A queue deleted elsewhere takes its end along; declared again, it is gray.
            old_id = host.queues["audit"].queue_id
            position = await meta.change_position()
            async with aclosing(meta.follow(position)) as feed:
                await meta.delete_queue("/", "audit")
                await meta.declare_queue(AUDIT)
                seen = await changes_until(feed, ("queue.declared", "audit"))
            for change in seen:
                await node.apply_change(change)
            assert node.gray.ends == {}
            assert host.queues["audit"].queue_id != old_id and host.gray_ended == set()
            assert gray_parts(host, "audit") == (0, 3)

            # A gap: the reload reads what the store has, whatever the registry held.
            await meta.set_gray_end(END)
            node.gray.end_set(END.model_copy(update={"queue": "audit"}))  # stale
            assert gray_parts(host, "audit") == ()
            await node.reload_metadata()
            assert node.gray.ends == {("/", "orders"): END}
            assert gray_parts(host, "orders") == ()
            assert gray_parts(host, "audit") == (0, 3)
            await node.shutdown()
            await meta.close()

    anyio.run(scenario)
