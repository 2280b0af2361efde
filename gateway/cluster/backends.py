"""Opening cluster mode's backends (`mqgw serve --meta redis://…`): ``open_cluster_backends``
opens the Redis metadata store and finds the broker groups through it (brokers register
themselves, see `mqgw broker --meta`; a replicated group's also heartbeat for the controller),
then connects a store per group: a RemoteStore to an unreplicated group's broker, a GroupStore
following a replicated group's master; both reconnect by themselves. A RoutedStore
(storage/clients/routed.py) routes each queue partition to its group, as the route table in
Redis says (gateway/cluster/placement.py: each new queue is placed on the live groups with the
fewest partitions before it is created), with one group as with several: groups registered
while the gateway runs are found and join it within about a second (gateway/cluster/groups.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING

import anyio

from gateway.cluster.groups import BrokerGroups, find_start_groups, open_group
from gateway.cluster.placement import QueuePlacement
from meta.redis_store import RedisMetadataStore
from storage import BrokerUnavailable
from storage.clients.routed import RoutedStore
from storage.port import StorePort

if TYPE_CHECKING:
    from gateway.config.settings import GatewaySettings

log = logging.getLogger("mqgw.cluster")


@asynccontextmanager
async def open_cluster_backends(
    settings: GatewaySettings, exchange_types: frozenset[str]
) -> AsyncIterator[tuple[StorePort, RedisMetadataStore]]:
    assert settings.meta is not None
    url = settings.meta
    meta = RedisMetadataStore(url, exchange_types=exchange_types, default_user=not settings.users)
    try:
        groups = await find_start_groups(meta, url)
        async with AsyncExitStack() as stack:
            stores: dict[str, StorePort] = {}
            for group, address in groups.items():
                try:
                    stores[group] = await stack.enter_async_context(
                        open_group(url, group, address, settings.node_name)
                    )
                except (BrokerUnavailable, TimeoutError) as error:
                    # Its queues wait for it (BrokerGroups adds it once it is back); the
                    # gateway serves the others meanwhile.
                    log.warning("cluster: broker group %s is down at start (%s); its queues "
                                "are unavailable until it is back", group, error)  # fmt: skip
            if not stores:
                raise SystemExit(f"mqgw: no broker group of {url} could be reached")
            # A routed store even over one group: groups registered later join it.
            placement = QueuePlacement(meta, list(stores))
            for group, store in stores.items():
                placement.note_stored(group, await store.queues())
            routed = RoutedStore(stores, placement)
            later = BrokerGroups(meta, url, settings.node_name, routed, placement)
            placement.live = later.live
            placement.discover = later.ensure
            log.info("cluster: metadata in %s, queues placed over broker groups %s",
                     url, ", ".join(sorted(stores)))  # fmt: skip
            async with later.running():
                yield routed, meta
    finally:
        with anyio.CancelScope(shield=True):
            await meta.close()
