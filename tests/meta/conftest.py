from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from meta.store import MetadataStore
from tests.harness.redis_server import RedisServer
from tests.meta.contract import COMBOS, Stores


@pytest.fixture(scope="session")
def shared_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the session; tests keep apart by key prefix."""
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server of the test's own, for tests that stop or restart it."""
    with RedisServer(tmp_path_factory.mktemp("own-redis")) as server:
        yield server


@pytest.fixture(params=COMBOS)
def combo(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(store kind, anyio backend): a contract module's anyio_backend is ``combo[1]``."""
    kind, backend = request.param
    return str(kind), str(backend)


@pytest.fixture
async def stores(
    combo: tuple[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Stores]:
    redis = request.getfixturevalue("shared_redis") if combo[0] == "redis" else None
    created = Stores(combo[0], tmp_path, redis)
    yield created
    await created.close()


@pytest.fixture
def store(stores: Stores) -> MetadataStore:
    return stores.main
