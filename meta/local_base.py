"""The local store's state and its persistence: what meta.local_store's calls share.

``LocalStoreBase`` holds the topology (meta.state), the other records
(meta.local_document's ``LocalRecords``), the keyed-order routes and the in-memory change
feed, loads ``metadata.json`` at construction (or bootstraps a fresh node) and writes it back
with ``_commit``: group-committed under a lock so an older snapshot never replaces a newer
one, and kept in memory on a full disk until ``retry_write``. It also hands out queue ids
from blocks reserved ahead of use (``_commit_if`` persists a new block before any of its ids
escapes). The calls of the MetadataStore are in meta.local_records and meta.local_store.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import anyio
import anyio.to_thread

from meta import checks
from meta.change_feed import DEFAULT_LOCAL_FEED_LENGTH, MemoryChangeFeed
from meta.local_document import FILE_NAME, LocalRecords, dump_document, load_document
from meta.local_routes import LocalRoutes
from meta.metadata_file import MetadataFile
from meta.models import BUILTIN_EXCHANGE_TYPES, DEFAULT_VHOST, Permission, QueueDef, User, VHost
from meta.password import hash_password
from meta.state import MetadataState
from meta.vhost_limits import ConnectionCounts, LocalConnections

QUEUE_ID_BLOCK = 1024


class LocalStoreBase(LocalConnections):
    """The state and persistence of LocalMetadataStore. Construct once; it loads synchronously."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        exchange_types: Iterable[str] = BUILTIN_EXCHANGE_TYPES,
        max_topic_hash_wildcards: int | None = checks.MAX_TOPIC_HASH_WILDCARDS,
        default_user: bool = True,
        change_feed_max_len: int = DEFAULT_LOCAL_FEED_LENGTH,
    ) -> None:
        self._default_user = default_user
        self._feed = MemoryChangeFeed(change_feed_max_len)
        self._dir = Path(data_dir)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._path = self._dir / FILE_NAME
        self._records = LocalRecords()
        self._connections = ConnectionCounts()  # in memory: connections end with the process
        self._next_queue_id = 1
        self._queue_id_reserved_until = 1  # ids below this may have been handed out
        self._state = MetadataState(
            self._allocate_queue_id, exchange_types, max_topic_hash_wildcards
        )
        self._routes = LocalRoutes(self._state)  # keyed-order queues' versioned routes
        self._version = 0
        self._persisted_version = 0
        self._persisted_queue_id_floor = 1
        self._write_lock = anyio.Lock()
        self._file = MetadataFile(self._path)  # on a full disk: in memory, see retry_write
        if self._path.exists():
            self._load_file()
        else:
            self._bootstrap()
            self._version = 1
            if self._file.write(self._snapshot()):
                self._persisted_version = 1
                self._persisted_queue_id_floor = self._queue_id_reserved_until

    def _bootstrap(self) -> None:
        """A fresh node: vhost '/', user guest/guest (administrator) with full rights, unless
        the configuration names its own users (RabbitMQ's default_user, first boot only)."""
        self._state.add_vhost(VHost(name=DEFAULT_VHOST))
        if not self._default_user:
            return
        self._records.users["guest"] = User(
            name="guest", password_hash=hash_password("guest"), tags=("administrator",)
        )
        self._records.permissions[("guest", DEFAULT_VHOST)] = Permission(
            user="guest", vhost=DEFAULT_VHOST
        )

    def _allocate_queue_id(self) -> int:
        if self._next_queue_id >= self._queue_id_reserved_until:
            # Reserve a block; the caller's mutation persists it before the id escapes.
            self._queue_id_reserved_until = self._next_queue_id + QUEUE_ID_BLOCK
        queue_id = self._next_queue_id
        self._next_queue_id += 1
        return queue_id

    def _snapshot(self) -> bytes:
        return dump_document(
            self._state, self._records, self._routes, self._queue_id_reserved_until
        )

    def _load_file(self) -> None:
        floor = load_document(self._path, self._state, self._records, self._routes)
        self._next_queue_id = self._queue_id_reserved_until = floor
        self._persisted_queue_id_floor = floor

    async def _commit(self) -> None:
        """Persist everything up to now; returns once it is durable on disk (on a full disk:
        once it is kept in memory for ``retry_write``)."""
        self._version += 1
        target = self._version
        async with self._write_lock:
            if self._persisted_version >= target:
                return  # another writer's snapshot already contained our change
            version, floor = self._version, self._queue_id_reserved_until
            payload = self._snapshot()
            if await anyio.to_thread.run_sync(self._file.write, payload):
                self._persisted_version, self._persisted_queue_id_floor = version, floor

    async def retry_write(self) -> None:
        """Write what a full disk kept in memory (cheap when everything is on disk)."""
        if self._persisted_version < self._version:
            await self._commit()

    async def _commit_if(self, durable_changed: bool) -> None:
        # A new queue-id block must be on disk before any id from it is handed out.
        if durable_changed or self._queue_id_reserved_until > self._persisted_queue_id_floor:
            await self._commit()

    def _drop_with_queues(self, queues: Iterable[QueueDef]) -> None:
        """Deleted queues lose their gray end and route (no change of their own:
        queue.deleted says it)."""
        for q in queues:
            self._records.gray_ends.pop((q.vhost, q.name), None)
            self._routes.drop(q)
