"""A partition closed on the master (a record flagged CLOSES) stays closed on the slave that
takes over: the slave closed it when it indexed the replicated record, so an append naming it
is refused there, per destination, as the old master refused it."""

from __future__ import annotations

import anyio
import pytest

from storage import Record, connect_remote_store
from storage.errors import NotMaster
from storage.record import CLOSES, PERSISTENT
from storage.results import AppendResult
from tests.replication.conftest import Group

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


def rec(body: bytes, *dests: tuple[int, int], flags: int = PERSISTENT) -> Record:
    return Record(b"ex", b"rk", b"", body, tuple(dests), flags=flags)


async def test_a_promoted_slave_refuses_the_partition_its_master_closed(group: Group) -> None:
    _record, master, slave_id = await group.master_and_slave()
    async with connect_remote_store(master.address) as store:
        await store.create_queue(1, 2)
        await store.append([rec(b"a0", (1, 0))], wait_durable=True)
        closing = rec(b"close", (1, 0), flags=PERSISTENT | CLOSES)
        assert (await store.append([closing], wait_durable=True)).refused == ()
        refused = await store.append([rec(b"late", (1, 0)), rec(b"b0", (1, 1))])
        assert refused.refused == ((0, 1, 0),)
    master.kill()
    await group.until(lambda r: r.master == slave_id, timeout_s=10)
    async with connect_remote_store(group.brokers[slave_id].address) as store:
        batch = [rec(b"x", (1, 0)), rec(b"b1", (1, 1)), rec(b"y", (1, 0), (1, 1))]
        result: AppendResult | None = None
        with anyio.fail_after(10):
            while result is None:
                try:  # elected, maybe not told yet: its next heartbeat answer tells it
                    result = await store.append(batch, wait_durable=True)
                except NotMaster:
                    await anyio.sleep(0.05)
        assert result.refused == ((0, 1, 0), (2, 1, 0))
        held = {p: [bytes(m.body) for m in (await store.read(1, p, 0)).messages] for p in (0, 1)}
        assert held == {0: [b"a0", b"close"], 1: [b"b0", b"b1", b"y"]}
