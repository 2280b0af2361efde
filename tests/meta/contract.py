"""The stores of the MetadataStore contract suite (test_meta_contract*.py; the fixtures
``combo``, ``stores`` and ``store`` are in conftest.py).

Every contract test runs on the local store (asyncio and trio) and on the Redis store
(asyncio; a real redis-server, each test under its own key prefix). ``stores.main`` is the
store under test; ``stores.peer()`` another handle on the same metadata (Redis: a second
client, as a second gateway has; local: the same object, the only one an embedded node
has); ``stores.fresh(**options)`` a store over new, empty metadata.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from meta.local_store import LocalMetadataStore
from meta.redis_store import RedisMetadataStore
from meta.store import MetadataStore
from tests.harness.redis_server import RedisServer

COMBOS = [
    pytest.param(("local", "asyncio"), id="local-asyncio"),
    pytest.param(("local", "trio"), id="local-trio"),
    pytest.param(("redis", "asyncio"), id="redis"),
]


class Stores:
    def __init__(self, kind: str, tmp_path: Path, redis: RedisServer | None) -> None:
        self.kind = kind
        self._tmp_path = tmp_path
        self._redis = redis
        self._opened: list[MetadataStore] = []
        self._prefix = self._new_prefix()
        self.main = self._open(self._prefix, tmp_path / "main")

    @staticmethod
    def _new_prefix() -> str:
        return f"t{uuid.uuid4().hex[:10]}:"

    def _open(self, prefix: str, directory: Path, **options: Any) -> MetadataStore:
        store: MetadataStore
        if self._redis is not None:
            store = RedisMetadataStore(self._redis.url, prefix=prefix, **options)
        else:
            store = LocalMetadataStore(directory, **options)
        self._opened.append(store)
        return store

    def peer(self) -> MetadataStore:
        if self._redis is None:
            return self.main
        return self._open(self._prefix, self._tmp_path / "main")

    def fresh(self, **options: Any) -> MetadataStore:
        name = self._new_prefix()
        return self._open(name, self._tmp_path / name.rstrip(":"), **options)

    async def close(self) -> None:
        for store in self._opened:
            await store.close()
