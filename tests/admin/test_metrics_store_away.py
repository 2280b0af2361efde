"""A /metrics scrape while the store cannot answer (every broker group of a cluster away):
the store's figures are left out and the rest is scraped. ``held_back_bytes`` raising used
to leave the per-queue held figures unset, and the scrape answered 500."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from gateway.admin.metrics_api import exposition, take_snapshot
from gateway.config.settings import GatewaySettings
from gateway.node import Node
from meta.local_store import LocalMetadataStore
from meta.models import QueueDef
from storage import FlushPolicy, StoreConfig, StoreError, open_embedded_store


class _Away:
    """``inner`` whose store figures fail as a store with no broker group to ask does."""

    AWAY = ("held_back_bytes", "disk_bytes", "backlog_bytes")

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, attribute: str) -> Any:
        if attribute not in self.AWAY:
            return getattr(self._inner, attribute)

        async def away(*_args: Any) -> Any:
            raise StoreError("no broker group answers")

        return away


def test_a_scrape_with_the_store_away_leaves_the_store_figures_out(tmp_path: Path) -> None:
    async def scenario() -> None:
        config = StoreConfig(tmp_path / "store", flush=FlushPolicy.ASYNC)
        async with open_embedded_store(config) as store:
            meta = LocalMetadataStore(tmp_path / "meta")
            node = Node(GatewaySettings(data_dir=tmp_path), store, meta)
            vhost = await node.open_vhost("/")
            await vhost.declare_queue(QueueDef(vhost="/", name="scraped"), False, "c")
            node.store = _Away(store)  # type: ignore[assignment]

            snapshot = await take_snapshot(node, per_object=True)  # raised UnboundLocalError
            assert "store_held" not in snapshot.gauges and "store_disk" not in snapshot.gauges
            assert snapshot.gauges["queues"] == 1
            [(_, name, row)] = snapshot.queues
            assert name == "scraped" and row[0] == 0  # ready, still counted
            text = (await exposition(snapshot)).decode()
            assert 'rabbitmq_queue_messages_ready{queue="scraped",vhost="/"} 0.0' in text
            assert "mqgw_store_held_back_bytes " not in text
            assert "mqgw_queue_held_back_bytes" not in text

    anyio.run(scenario)
