"""x-max-length-bytes with reject-publish over the broker protocol, against real `mqgw
broker` processes: two clients (two gateways) appending at once to one queue never take it
past its byte limit, the limit holds across a broker kill -9 and restart (the broker counts
again from its store), and a RoutedStore's groups each count their own part."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import pytest

from bench.servers import BrokerServer as BrokerProcess
from localcluster.ports import free_port
from storage import QUEUE_GROUP, BrokerUnavailable, Record, RemoteStore, connect_remote_store
from storage.clients.routed import RoutedStore

pytestmark = [
    pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"]),
    pytest.mark.anyio,
]

LIMIT_BYTES = 3000


def rec(body: bytes, *dests: tuple[int, int]) -> Record:
    return Record(b"", b"k", b"", body, tuple(dests), born_ts_ms=1, flags=0)


async def ready_bodies(store: RemoteStore, queue_id: int, partition: int = 0) -> list[bytes]:
    """The bodies after the queue's committed offset."""
    offset = await store.committed_offset(QUEUE_GROUP, queue_id, partition)
    got: list[bytes] = []
    while True:
        page = await store.read(queue_id, partition, offset, max_count=1000)
        if not page.messages:
            return got
        got += [bytes(m.body) for m in page.messages]
        offset = page.next_offset


@asynccontextmanager
async def brokers(tmp_path: Path, *names: str) -> AsyncIterator[dict[str, BrokerProcess]]:
    started: dict[str, BrokerProcess] = {}
    try:
        for name in names:
            process = BrokerProcess(
                tmp_path / name, free_port(), tmp_path / f"{name}.log", group=name
            )
            started[name] = process.start()
        yield started
    finally:
        for process in started.values():
            process.kill()


async def test_two_clients_at_once_never_pass_the_byte_limit(tmp_path: Path) -> None:
    async with (
        brokers(tmp_path, "g1") as procs,
        connect_remote_store(procs["g1"].address, unavailable_wait_s=5.0) as a,
        connect_remote_store(procs["g1"].address) as b,
    ):
        await a.create_queue(1, 1)
        for store in (a, b):
            store.set_append_limit(1, None, LIMIT_BYTES)
        accepted: dict[str, list[bytes]] = {"a": [], "b": []}
        refusals = {"a": 0, "b": 0}

        async def publish(name: str, store: RemoteStore, size: int) -> None:
            for i in range(60):  # batches of 4: 60 * 4 * size is far past the limit
                batch = [rec(name.encode() * size, (1, 0)) for _ in range(4)]
                result = await store.append(batch)
                refused = {index for index, _, _ in result.refused}
                refusals[name] += len(refused)
                accepted[name] += [bytes(r.body) for n, r in enumerate(batch) if n not in refused]
                if i % 8 == 0:
                    await anyio.sleep(0)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(publish, "a", a, 70)
                tg.start_soon(publish, "b", b, 30)
        stored = await ready_bodies(a, 1)
        assert sorted(stored) == sorted(accepted["a"] + accepted["b"])
        total = sum(map(len, stored))
        assert LIMIT_BYTES - 30 < total <= LIMIT_BYTES  # full: not even b's 30 fits
        assert accepted["a"] and accepted["b"] and refusals["a"] and refusals["b"]

        # kill -9 and restart: the broker counts again from what its store holds.
        procs["g1"].kill()
        procs["g1"].start()
        result = None
        with anyio.fail_after(20):
            while result is None:
                try:
                    result = await b.append([rec(b"x" * (LIMIT_BYTES - total + 1), (1, 0))])
                except BrokerUnavailable:
                    await anyio.sleep(0.05)
        assert [index for index, _, _ in result.refused] == [0]
        # Consumed up to the fifth message: exactly its bytes are room again.
        await a.commit_offset(QUEUE_GROUP, 1, 0, 5)
        room = LIMIT_BYTES - total + sum(map(len, stored[:5]))
        fits = await b.append([rec(b"y" * room, (1, 0)), rec(b"", (1, 0)), rec(b"z", (1, 0))])
        assert [index for index, _, _ in fits.refused] == [2]  # an empty body still fits
        assert sum(map(len, await ready_bodies(a, 1))) == LIMIT_BYTES


async def test_routed_groups_count_their_own_part_and_both_limits_travel(
    tmp_path: Path,
) -> None:
    async with brokers(tmp_path, "a", "b") as procs, AsyncExitStack() as stack:
        remotes = {
            name: await stack.enter_async_context(connect_remote_store(p.address))
            for name, p in procs.items()
        }
        placement = {1: ["a", "b"], 2: ["b"]}
        store = RoutedStore(dict(remotes), placement.get, home="a")
        await store.create_queue(1, 2)
        await store.create_queue(2, 1)
        store.set_append_limit(1, None, 100)
        store.set_append_limit(2, 2, 1000)
        batch = [
            rec(b"a" * 60, (1, 0)),  # group a: 60
            rec(b"b" * 60, (1, 1), (2, 0)),  # group b: 60 for queue 1; queue 2's first
            rec(b"c" * 60, (1, 0)),  # group a: 120 > 100, refused
            rec(b"d" * 40, (1, 1), (2, 0)),  # group b: 100 fits; queue 2's second
            rec(b"e" * 1, (2, 0)),  # queue 2: a third message, refused
        ]
        result = await store.append(batch)
        assert sorted(result.refused) == [(2, 1, 0), (4, 2, 0)]
        part_a = await ready_bodies(remotes["a"], 1, 0)
        part_b = await ready_bodies(remotes["b"], 1, 1)
        assert (part_a, part_b) == ([b"a" * 60], [b"b" * 60, b"d" * 40])
        assert await ready_bodies(remotes["b"], 2) == [b"b" * 60, b"d" * 40]
        # A limit lifted is no longer sent: everything fits again.
        store.set_append_limit(1, None, None)
        assert (await store.append([rec(b"f" * 500, (1, 0))])).refused == ()
