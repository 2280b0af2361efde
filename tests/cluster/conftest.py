"""Small real clusters for tests, each process on free loopback ports, all stopping with the
test: ``cluster`` (redis-server, one `mqgw broker`, gateways added with `--meta`) and
``two_groups`` (two unreplicated broker groups g1 and g2, gateways gwA and gwB)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pika
import pytest
import redis

from bench.servers import BrokerServer, GatewayServer, free_port
from meta.redis_keys import RedisKeys
from meta.redis_store import RedisMetadataStore
from storage import connect_remote_store
from tests.harness.redis_server import RedisServer


@dataclass
class Cluster:
    root: Path
    redis: RedisServer
    broker: BrokerServer
    gateways: list[GatewayServer] = field(default_factory=list)

    def add_gateway(self, name: str, env: dict[str, str] | None = None) -> GatewayServer:
        gateway = GatewayServer(
            self.root / name,
            ["--meta", self.redis.url, "--node-name", name, "--admin-port", str(free_port())],
            env=env,
        ).start()
        self.gateways.append(gateway)
        return gateway


def _stop_gateways(gateways: list[GatewayServer]) -> None:
    for gateway in gateways:
        gateway.kill()
        # Captured output, shown by pytest only when the test failed.
        print(f"--- gateway {gateway.data_dir.name} log tail ---\n{gateway.log()[-6000:]}")


@contextmanager
def running_cluster(root: Path, gateways: Iterable[str] = ()) -> Iterator[Cluster]:
    """Redis, one broker and ``gateways`` under ``root``, all stopped on the way out (module
    fixtures share one among their tests)."""
    redis = RedisServer(root / "redis").start()
    broker = BrokerServer(root / "broker", free_port(), root / "broker.log", "g1", "0",
                          meta=redis.url)  # fmt: skip
    made = Cluster(root, redis, broker)
    try:
        broker.start()
        for name in gateways:
            made.add_gateway(name)
        yield made
    finally:
        _stop_gateways(made.gateways)
        broker.kill()
        redis.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path) as made:
        yield made


GROUPS = ("g1", "g2")
Channel = pika.adapters.blocking_connection.BlockingChannel


@dataclass
class TwoGroups:
    redis: RedisServer
    brokers: dict[str, BrokerServer]
    gateways: list[GatewayServer] = field(default_factory=list)

    def route(self, queue: str) -> list[str] | None:
        client = redis.Redis.from_url(self.redis.url, decode_responses=True)
        try:
            text = client.get(RedisKeys().route("/", queue))
        finally:
            client.close()
        return None if text is None else list(json.loads(text))

    def broker_queues(self, group: str) -> dict[int, int]:
        async def ask() -> dict[int, int]:
            async with connect_remote_store(self.brokers[group].address) as store:
                return await store.queues()

        return anyio.run(ask)


@pytest.fixture
def two_groups(tmp_path: Path) -> Iterator[TwoGroups]:
    server = RedisServer(tmp_path / "redis").start()
    brokers = {
        g: BrokerServer(tmp_path / g, free_port(), tmp_path / f"{g}.log", g, "0", meta=server.url)
        for g in GROUPS
    }
    made = TwoGroups(server, brokers)
    try:
        for broker in brokers.values():
            broker.start()
        for name in ("gwA", "gwB"):
            args = ["--meta", server.url, "--node-name", name, "--admin-port", str(free_port())]
            made.gateways.append(GatewayServer(tmp_path / name, args).start())
        yield made
    finally:
        _stop_gateways(made.gateways)
        for broker in brokers.values():
            broker.kill()
        server.stop()


def connect(gateway: GatewayServer) -> tuple[pika.BlockingConnection, Channel]:
    conn = pika.BlockingConnection(pika.URLParameters(gateway.url))
    return conn, conn.channel()


def count(ch: Channel, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


# In-process tests of the cluster's Redis side: one redis-server per module, and a metadata
# store on it under a fresh key prefix per test.


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}:"


@pytest.fixture
async def meta(redis_server: RedisServer, prefix: str) -> AsyncIterator[RedisMetadataStore]:
    store = RedisMetadataStore(redis_server.url, prefix=prefix)
    yield store
    await store.close()
