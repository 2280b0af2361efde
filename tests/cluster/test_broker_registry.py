"""`mqgw broker --meta`: a broker registers itself in the metadata store on Redis, keeps its
lease alive while it runs, and is seen as dead once killed (its lease lapses)."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from bench.servers import BrokerServer, free_port
from meta.redis_store import RedisMetadataStore
from tests.harness.redis_server import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


async def test_a_broker_registers_and_its_lease_lapses_when_it_dies(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis").start() as redis:
        broker = BrokerServer(
            tmp_path / "b", free_port(), tmp_path / "b.log", "g7", "1", meta=redis.url
        ).start()
        meta = RedisMetadataStore(redis.url, default_user=False)
        try:
            with anyio.fail_after(10):
                while not (brokers := await meta.list_brokers()):
                    await anyio.sleep(0.05)
            (info,) = brokers
            assert (info.group, info.broker_id, info.address) == ("g7", "1", broker.address)
            assert info.alive
            # Renewed while it runs: still alive after more than one lease period.
            await anyio.sleep(6)
            assert [b.alive for b in await meta.list_brokers()] == [True]
            broker.kill()
            died = time.monotonic()
            with anyio.fail_after(10):
                while (await meta.list_brokers())[0].alive:
                    await anyio.sleep(0.1)
            assert time.monotonic() - died <= 6.0  # the 5 s lease, and no more
            assert "broker g7/1 registered in" in broker.log()
        finally:
            broker.kill()
            await meta.close()


async def test_an_advertised_address_is_what_gateways_are_told(tmp_path: Path) -> None:
    with RedisServer(tmp_path / "redis").start() as redis:
        broker = BrokerServer(
            tmp_path / "b", free_port(), tmp_path / "b.log", "g1", "0", meta=redis.url,
            args=["--advertise", "broker-g1-0.mqgw.svc:7000"],
        ).start()  # fmt: skip
        meta = RedisMetadataStore(redis.url, default_user=False)
        try:
            with anyio.fail_after(10):
                while not (brokers := await meta.list_brokers()):
                    await anyio.sleep(0.05)
            assert [b.address for b in brokers] == ["broker-g1-0.mqgw.svc:7000"]
        finally:
            broker.kill()
            await meta.close()
