"""A replicated broker group as real processes: redis-server, `mqgw controller`, and brokers
started with `--replication`, on free loopback ports, all stopping with the test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from bench.servers import BrokerServer, GatewayServer, free_port
from meta.groups.link import GroupLink
from meta.groups.records import GroupRecord
from tests.controller.fakes import ControllerProcess
from tests.harness.redis_server import RedisServer

GROUP = "g1"


@dataclass
class Group:
    root: Path
    redis: RedisServer
    link: GroupLink
    brokers: dict[str, BrokerServer] = field(default_factory=dict)
    controllers: list[ControllerProcess] = field(default_factory=list)
    gateways: list[GatewayServer] = field(default_factory=list)

    def add_gateway(self, name: str) -> GatewayServer:
        gateway = GatewayServer(
            self.root / name,
            ["--meta", self.redis.url, "--node-name", name, "--admin-port", str(free_port())],
        ).start()
        self.gateways.append(gateway)
        return gateway

    def add_broker(self, broker_id: str, *flags: str, meta: str | None = None) -> BrokerServer:
        broker = BrokerServer(
            self.root / broker_id, free_port(), self.root / f"{broker_id}.log", GROUP, broker_id,
            meta=meta or self.redis.url, args=["--replication", "sync", *flags],
        )  # fmt: skip
        self.brokers[broker_id] = broker.start()
        return broker

    def add_controller(self, name: str) -> ControllerProcess:
        controller = ControllerProcess(name, self.redis.url, self.root / f"{name}.log").start()
        self.controllers.append(controller)
        return controller

    async def record(self) -> GroupRecord:
        try:
            return await self.link.record(GROUP)
        except RedisConnectionError:  # Redis restarted under our pooled connection: once more
            return await self.link.record(GROUP)

    async def until(
        self, check: Callable[[GroupRecord], bool], timeout_s: float = 15
    ) -> GroupRecord:
        with anyio.fail_after(timeout_s):
            while True:
                record = await self.record()
                if check(record):
                    return record
                await anyio.sleep(0.05)

    def master(self, record: GroupRecord) -> BrokerServer:
        return self.brokers[record.master]

    async def master_and_slave(self) -> tuple[GroupRecord, BrokerServer, str]:
        """A controller and brokers a and b, once both are in sync: the record, the master
        and the slave's id."""
        self.add_controller("c1")
        self.add_broker("a")
        self.add_broker("b")
        record = await self.until(lambda r: r.master != "" and len(r.in_sync) == 2)
        slave_id = next(i for i in self.brokers if i != record.master)
        return record, self.master(record), slave_id


@pytest.fixture
async def group(tmp_path: Path) -> AsyncIterator[Group]:
    with RedisServer(tmp_path / "redis") as redis:
        client = Redis.from_url(redis.url, decode_responses=True, protocol=2)
        made = Group(tmp_path, redis, GroupLink(client))
        try:
            yield made
        finally:
            for gateway in made.gateways:
                gateway.kill()
            for broker in made.brokers.values():
                broker.kill()
            for controller in made.controllers:
                controller.kill()
            await client.aclose()
