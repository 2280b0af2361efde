"""A small real cluster for tests: redis-server, one `mqgw broker`, and gateways started with
`--meta`, each on free loopback ports, all stopping with the test."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.servers import BrokerServer, GatewayServer, free_port
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


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    redis = RedisServer(tmp_path / "redis").start()
    broker = BrokerServer(
        tmp_path / "broker", free_port(), tmp_path / "broker.log", "g1", "0", meta=redis.url
    )
    made = Cluster(tmp_path, redis, broker)
    try:
        broker.start()
        yield made
    finally:
        for gateway in made.gateways:
            gateway.kill()
            # Captured output, shown by pytest only when the test failed.
            print(f"--- gateway {gateway.data_dir.name} log tail ---\n{gateway.log()[-6000:]}")
        broker.kill()
        redis.stop()
