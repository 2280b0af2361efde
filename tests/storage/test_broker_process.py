"""`mqgw broker` as a real process: kill -9 it under durable appends, restart it on the same
data directory and port, and check that the same RemoteStore reconnects by itself and reads
back every record the broker confirmed (crash recovery over the remote protocol)."""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import anyio
import pytest

from bench.servers import BrokerServer as BrokerProcess
from bench.servers import free_port
from storage import BrokerUnavailable, Record, RemoteStore, connect_remote_store
from tests.harness.waiting import eventually
from tests.storage.helpers import bodies

T = TypeVar("T")

pytestmark = [
    pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"]),
    pytest.mark.anyio,
]


async def settled(timeout_s: float, probe: Callable[[], Awaitable[T]]) -> T:
    """``probe``'s first truthy answer, a broker away meanwhile counting as "not yet"."""
    return (await eventually(timeout_s, probe, retry_on=(BrokerUnavailable,)))[0]


async def read_all(store: RemoteStore, queue_id: int, partition: int) -> list[bytes]:
    got: list[bytes] = []
    offset = 0
    while True:
        page = await store.read(queue_id, partition, offset, max_count=1000)
        if not page.messages:
            return got
        got += bodies(page.messages)
        offset = page.next_offset


async def test_kill_9_restart_and_reconnect_with_every_confirmed_record(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", free_port(), tmp_path / "broker.log").start()
    try:
        async with connect_remote_store(
            broker.address, unavailable_wait_s=1.0, backoff_max_s=0.2
        ) as store:
            assert store.broker_name == "g1/a"
            await store.create_queue(1, 2)
            confirmed: dict[int, list[bytes]] = {n: [] for n in range(4)}

            def batch(n: int, i: int) -> list[Record]:
                body = b"%d/%d/" % (n, i)
                return [
                    Record(b"ex", b"rk", b"\x90\x00\x02", body + b"%d" % j, ((1, n % 2),))
                    for j in range(16)
                ]

            for i in range(10):  # plain durable appends, one at a time
                records = batch(0, i)
                await store.append(records)
                confirmed[0] += [r.body for r in records]

            # Four publishers keep a durable append in flight each; kill -9 meanwhile.
            failures: list[BrokerUnavailable] = []

            async def publish(n: int) -> None:
                i = 100
                try:
                    while True:
                        records = batch(n, i)
                        await store.append(records, wait_durable=True)
                        confirmed[n] += [r.body for r in records]
                        i += 1
                except BrokerUnavailable as error:
                    failures.append(error)

            async def enough() -> bool:  # every publisher has had appends confirmed
                return all(len(mine) >= 16 * 5 for mine in confirmed.values())

            with anyio.fail_after(30):
                async with anyio.create_task_group() as tg:
                    for n in range(4):
                        tg.start_soon(publish, n)
                    await settled(20, enough)
                    broker.kill()
            # Every call in flight failed at once, as BrokerUnavailable (outcome unknown).
            assert len(failures) == 4
            assert all("lost" in str(error) for error in failures), failures
            # A new call waits the bounded time for a connection, then fails the same way.
            started = time.monotonic()
            with pytest.raises(BrokerUnavailable, match="unavailable for 1 s"):
                await store.queues()
            assert 0.9 <= time.monotonic() - started < 5
            assert not store.connected

            broker.start()  # same data directory, same port
            # The same RemoteStore reconnects by itself: no new object, no call from us.
            assert await settled(15, store.queues) == {1: 2}
            assert store.connects == 2
            stored = [*await read_all(store, 1, 0), *await read_all(store, 1, 1)]
            for n, mine in confirmed.items():
                prefix = b"%d/" % n
                survived = [body for body in stored if body.startswith(prefix)]
                # Every confirmed record is back, in its order; at most the batch that was
                # in flight at the kill may be there too, unconfirmed.
                assert survived[: len(mine)] == mine
                assert len(survived) - len(mine) in (0, 16)
            after = await store.append(batch(9, 0))
            assert after.record_count == 16
        assert broker.stop() == 0
        log = broker.log()
        assert "received SIGTERM" in log and "closed cleanly" in log
        assert re.search(r"broker connection from 127\.0\.0\.1:\d+ opened", log)
        assert re.search(r"connection from 127\.0\.0\.1:\d+ \(mqgw\) closed after", log)
    finally:
        broker.kill()
