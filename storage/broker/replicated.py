"""`mqgw broker --replication sync|async`: a broker of a replicated group.

The store is opened as for a plain broker, wrapped in a ``ReplicatedStore`` and served; beside
it the ``ReplicationMember`` heartbeats through Redis and follows the controller's record
(docs/replication.md). Two store features that write to the log on their own are off in a
replicated group, since a slave's log must hold exactly the master's bytes: the copy-forward
collector and the early sealing of a drained active segment (consumed segments are still
reclaimed, on every member, from the replicated consumer offsets).
"""

from __future__ import annotations

import dataclasses
import logging
from contextlib import AbstractAsyncContextManager

import anyio
from redis.asyncio import Redis

from meta.groups.link import GroupLink
from meta.redis_url import async_client
from storage.broker.server import Ready, serve_store
from storage.clients.remote import RemoteStore, connect_remote_store
from storage.config import StoreConfig
from storage.log.embedded import open_embedded_store
from storage.replication.member import ReplicationMember
from storage.replication.replicated_store import ReplicatedStore
from storage.replication.settings import ReplicationSettings
from storage.replication.state import ReplicationState
from storage.wire.frames import MAX_FRAME_BYTES

log = logging.getLogger("mqgw.storage.replication")


def replicated_config(config: StoreConfig) -> StoreConfig:
    return dataclasses.replace(config, gc_max_live_ratio=0.0, roll_consumed_bytes=0)


async def serve_replicated_broker(
    config: StoreConfig,
    settings: ReplicationSettings,
    meta_url: str,
    host: str,
    port: int,
    ready: Ready,
    *,
    advertise: str | None = None,
    stop: anyio.Event | None = None,
) -> None:
    name = f"{settings.group}/{settings.broker_id}"
    client: Redis = async_client(meta_url, connect_timeout_s=1.0, socket_timeout_s=2.0)
    try:
        async with open_embedded_store(replicated_config(config)) as inner:
            state = await anyio.to_thread.run_sync(
                ReplicationState.load, config.data_dir, inner.log.fs
            )
            store = ReplicatedStore(inner, state, settings)
            listening = anyio.Event()
            address: list[str] = []

            def on_ready(bound_host: str, bound_port: int) -> None:
                address.append(advertise or f"{bound_host}:{bound_port}")
                listening.set()
                ready(bound_host, bound_port)

            def connect(to: str) -> AbstractAsyncContextManager[RemoteStore]:
                return connect_remote_store(to, name=f"slave {name}", unavailable_wait_s=2.0)

            async with anyio.create_task_group() as tg:

                async def member() -> None:
                    await listening.wait()
                    link = GroupLink(client)
                    await ReplicationMember(store, link, address[0], connect).run()

                tg.start_soon(member)
                await serve_store(
                    store, host, port, on_ready, name=name, stop=stop,
                    max_frame_bytes=MAX_FRAME_BYTES, replicated=store,
                )  # fmt: skip
                tg.cancel_scope.cancel()
            state.save()
    finally:
        with anyio.CancelScope(shield=True):
            await client.aclose()
    log.info("broker %s stopped; store %s closed cleanly", name, config.data_dir)
