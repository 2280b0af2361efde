"""Replication between real `mqgw broker --replication sync` processes, at the store API."""

from __future__ import annotations

import time

import anyio
import pytest

from storage import Record, connect_remote_store
from storage.errors import NotMaster
from tests.replication.conftest import Group

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


def _records(n: int, start: int = 0) -> list[Record]:
    return [Record(b"ex", b"rk", b"", f"m{start + i}".encode(), ((1, 0),)) for i in range(n)]


async def test_slave_holds_what_the_master_confirmed_and_takes_over(group: Group) -> None:
    _record, master, slave_id = await group.master_and_slave()
    async with connect_remote_store(master.address) as store:
        await store.create_queue(1, 1)
        for round_ in range(5):
            await store.append(_records(100, round_ * 100), wait_durable=True)
    async with connect_remote_store(group.brokers[slave_id].address) as slave:
        with pytest.raises(NotMaster):
            await slave.append(_records(1))
    master.kill()
    await group.until(lambda r: r.master == slave_id, timeout_s=10)
    async with connect_remote_store(group.brokers[slave_id].address) as store:
        bodies: list[bytes] = []
        offset = 0
        while len(bodies) < 500:
            try:
                result = await store.read(1, 0, offset, 1000)
            except NotMaster:  # elected, not told yet: its next heartbeat answer tells it
                await anyio.sleep(0.05)
                continue
            if not result.messages:
                continue
            bodies += [bytes(m.body) for m in result.messages]
            offset = result.next_offset
        assert bodies == [f"m{i}".encode() for i in range(500)]


async def test_a_slave_grows_a_queue_with_its_master(group: Group) -> None:
    """create_queue adding partitions on the master: the slave adds them too, keeps what the
    old ones hold, and indexes the new ones' records; it has all of them once it takes over."""
    _record, master, slave_id = await group.master_and_slave()

    def to(partition: int, *names: str) -> list[Record]:
        return [Record(b"ex", b"rk", b"", n.encode(), ((1, partition),)) for n in names]

    async with connect_remote_store(master.address) as store:
        await store.create_queue(1, 2)
        await store.append(to(0, "a0", "a1") + to(1, "b0"), wait_durable=True)
        await store.create_queue(1, 4)
        await store.append(to(3, "d0") + to(0, "a2"), wait_durable=True)
        await store.create_queue(1, 3)  # fewer: nothing changes
        await store.append(to(3, "d1"), wait_durable=True)
    master.kill()
    await group.until(lambda r: r.master == slave_id, timeout_s=10)
    async with connect_remote_store(group.brokers[slave_id].address) as store:
        with anyio.fail_after(10):
            while True:
                try:  # elected, maybe not told yet: its next heartbeat answer tells it
                    held = {p: (await store.read(1, p, 0)).messages for p in range(4)}
                    break
                except NotMaster:
                    await anyio.sleep(0.05)
        assert {p: [bytes(m.body) for m in ms] for p, ms in held.items()} == {
            0: [b"a0", b"a1", b"a2"],
            1: [b"b0"],
            2: [],
            3: [b"d0", b"d1"],
        }
        assert await store.queues() == {1: 4}
        await store.append(to(2, "c0"), wait_durable=True)
        assert [bytes(m.body) for m in (await store.read(1, 2, 0)).messages] == [b"c0"]


async def test_a_queue_created_or_grown_is_on_the_slave_before_the_master_answers(
    group: Group,
) -> None:
    """The master killed the moment create_queue answered: the new master has the queue and
    its new partitions (appends re-sent there would otherwise be indexed nowhere)."""
    record, _master, slave_id = await group.master_and_slave()
    async with connect_remote_store(group.master(record).address) as store:
        await store.create_queue(1, 1)
        await store.create_queue(2, 2)
        await store.create_queue(1, 3)  # grown
    group.master(record).kill()
    await group.until(lambda r: r.master == slave_id, timeout_s=10)
    async with connect_remote_store(group.brokers[slave_id].address) as store:
        with anyio.fail_after(10):
            while True:
                try:
                    await store.append([Record(b"ex", b"rk", b"", b"x", ((1, 2),))])
                    break
                except NotMaster:
                    await anyio.sleep(0.05)
        assert await store.queues() == {1: 3, 2: 2}
        assert [bytes(m.body) for m in (await store.read(1, 2, 0)).messages] == [b"x"]


async def test_master_with_a_slave_stops_at_once_on_sigterm(group: Group) -> None:
    group.add_controller("c1")
    group.add_broker("a")
    group.add_broker("b")
    record = await group.until(lambda r: r.master != "" and len(r.in_sync) == 2)
    master = group.master(record)
    started = time.monotonic()
    assert master.stop() == 0
    took = time.monotonic() - started
    assert took < 3, f"the master took {took:.1f} s to stop (a held fetch kept it waiting)"


async def test_a_resent_batch_is_not_counted_against_its_own_length_limit(group: Group) -> None:
    """A gateway re-sends a batch whose answer it lost: the master answers as it did the
    first time, and does not count the stored batch against the limit it carries."""
    group.add_controller("c1")
    group.add_broker("a")
    record = await group.until(lambda r: r.master != "" and len(r.in_sync) == 1)
    async with connect_remote_store(group.master(record).address) as store:
        with anyio.fail_after(10):
            while True:
                try:  # elected, maybe not told yet: its next heartbeat answer tells it
                    await store.create_queue(1, 1)
                    break
                except NotMaster:
                    await anyio.sleep(0.05)
        first = await store.append_batch(_records(5), 77, limits=[(1, 4)])
        assert first.refused == ((4, 1, 0),)  # the fifth would pass four
        again = await store.append_batch(_records(5), 77, limits=[(1, 4)])
        assert again.refused == first.refused  # not all five, as a second count would say
        assert (again.start_offset, again.end_offset) == (first.start_offset, first.end_offset)
        bodies = [bytes(m.body) for m in (await store.read(1, 0, 0)).messages]
        assert bodies == [b"m0", b"m1", b"m2", b"m3"]  # stored once
