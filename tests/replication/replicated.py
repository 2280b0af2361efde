"""A replicated broker's store in-process, for unit tests of its rules: an embedded store
with sync flush under a ReplicatedStore of group g1, no network and no Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from storage import FlushPolicy, StoreConfig, open_embedded_store
from storage.replication.replicated_store import ReplicatedStore
from storage.replication.settings import ReplicationSettings
from storage.replication.state import ReplicationState


@asynccontextmanager
async def replicated_store(
    directory: Path, broker_id: str, settings: ReplicationSettings | None = None
) -> AsyncIterator[ReplicatedStore]:
    config = StoreConfig(directory / "store", flush=FlushPolicy.SYNC)
    async with open_embedded_store(config) as inner:
        state = ReplicationState.load(config.data_dir, inner.log.fs)
        yield ReplicatedStore(inner, state, settings or ReplicationSettings("g1", broker_id))
