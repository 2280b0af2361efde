"""A delivering gateway whose lease another gateway took over reads nothing more to deliver
(found by the nemesis run, seed 4: a gateway cut off from Redis and the brokers came back,
went on reading and delivering for a moment after the new holder had begun, and the same
messages went out twice, the second time without the redelivered flag). Its reads carry
its fencing token; the broker refuses them once a higher token holds the partition."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from gateway.queues.runtime import QueueRuntime
from meta.models import QueueDef
from storage import QUEUE_GROUP, Record, open_embedded_store
from storage.errors import StaleFence
from storage.log.embedded import EmbeddedStore
from tests.gateway.queues.test_push_scheduler import _config


def test_a_replaced_holder_stops_reading_and_delivering(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with open_embedded_store(_config(tmp_path / "store")) as store:
            await store.create_queue(1, 1)
            queue = QueueRuntime(QueueDef(vhost="/", name="q", queue_id=1), store)
            queue.start_leasing()
            queue.fences[0] = 5
            await queue.take_over(0)
            assert queue.may_serve()
            records = [Record(b"", b"q", b"", b"m%d" % n, ((1, 0),)) for n in range(3)]
            await store.append(records)
            await queue.fill()
            assert len(queue.buffer) == 3
            queue.buffer.clear()  # delivered
            # Another gateway takes the partition over (its token registered at the broker).
            assert await store.committed_offset(QUEUE_GROUP, 1, 0, fence=6) == 0
            await store.append([Record(b"", b"q", b"", b"m3", ((1, 0),))])
            queue.exhausted = False
            await queue.fill()
            assert not queue.buffer  # m3 is the new holder's to deliver, not ours
            assert not queue.may_serve() and queue.fences[0] == 0

    anyio.run(scenario)


def test_a_refusal_of_an_older_token_leaves_the_newer_lease_alone(tmp_path: Path) -> None:
    """A read that went out with token 5 comes back refused after this gateway took the
    lease again with 7 (its own take-over shut the read out): the partition stays held."""

    async def scenario() -> None:
        async with open_embedded_store(_config(tmp_path / "store")) as store:
            await store.create_queue(1, 1)
            queue = QueueRuntime(QueueDef(vhost="/", name="q", queue_id=1), store)
            queue.start_leasing()
            queue.fences[0] = 7
            await queue.take_over(0)
            refused = StaleFence("fencing token 5 is stale: token 7 holds it now")
            queue.lose_lease(0, refused, 5)
            assert queue.may_serve() and queue.fences[0] == 7
            queue.lose_lease(0, refused, 7)  # our own token refused: lost
            assert not queue.may_serve() and queue.fences[0] == 0

    anyio.run(scenario)


class _Following:
    """A group store's view of one partition whose copies the gateway follows in turn:
    every call goes to ``current`` (a failover, or Redis taking an election back)."""

    def __init__(self, current: EmbeddedStore) -> None:
        self.current = current

    def __getattr__(self, name: str) -> Any:
        return getattr(self.current, name)


async def _two_copies(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedStore, EmbeddedStore]]:
    async with (
        open_embedded_store(_config(tmp_path / "a")) as a,
        open_embedded_store(_config(tmp_path / "b")) as b,
    ):
        records = [Record(b"", b"q", b"", b"m%d" % n, ((1, 0),)) for n in range(4)]
        for copy in (a, b):
            await copy.create_queue(1, 1)
            await copy.append(records)
        yield a, b


async def _flags_after_moving_to_b(a: EmbeddedStore, b: EmbeddedStore) -> list[tuple[bytes, bool]]:
    """Take the partition over (token 200) on copy a, move to copy b, read all there."""
    store = _Following(a)
    queue = QueueRuntime(QueueDef(vhost="/", name="q", queue_id=1), cast(Any, store))
    queue.start_leasing()
    queue.fences[0] = 200
    await queue.take_over(0)  # on copy a, which nobody held: nothing flagged there
    store.current = b
    await queue.fill()
    await b.append([Record(b"", b"q", b"", b"m4", ((1, 0),))])
    queue.exhausted = False
    await queue.fill()
    taken = [queue.take() for _ in range(5)]
    return [(bytes(t[1].body), t[2]) for t in taken if t is not None]


def test_a_copy_where_a_replaced_holder_read_flags_what_lay_there(tmp_path: Path) -> None:
    """Nemesis seed 107: the new holder took the partition over on one copy; the replaced
    holder, following the other, delivered from it before the new holder's fence reached
    it. Read from that copy, what lay there is flagged redelivered; what came after is not;
    and the replaced holder reads no more there."""

    async def scenario() -> None:
        async with asynccontextmanager(_two_copies)(tmp_path) as (a, b):
            old = await b.read(1, 0, 0, 10, fence=100)  # the replaced holder, on copy b
            assert len(old.messages) == 4
            flags = await _flags_after_moving_to_b(a, b)
            assert flags == [(b"m0", True), (b"m1", True), (b"m2", True), (b"m3", True),
                             (b"m4", False)]  # fmt: skip
            with pytest.raises(StaleFence):
                await b.read(1, 0, 4, 10, fence=100)

    anyio.run(scenario)


def test_a_copy_that_had_our_fence_already_flags_nothing(tmp_path: Path) -> None:
    """A failover to a slave that had the new holder's fence by replication: the replaced
    holder cannot have read there since, and nothing is flagged (a failover does not mark
    the backlog redelivered)."""

    async def scenario() -> None:
        async with asynccontextmanager(_two_copies)(tmp_path) as (a, b):
            await b.committed_offset(QUEUE_GROUP, 1, 0, fence=200)  # as replication brings it
            flags = await _flags_after_moving_to_b(a, b)
            assert flags == [(b"m%d" % n, False) for n in range(5)]

    anyio.run(scenario)


def test_a_copy_that_ends_below_what_was_read_flags_what_is_read_again(tmp_path: Path) -> None:
    """Nemesis seed 108: the group failed over to a lagging copy (b), which lacks what the
    gateway had read and delivered on the old master (a), then to one that has it (c). The
    cursor goes back to b's end, so that what b takes next is not skipped; what is read
    again below where the gateway was is flagged redelivered (it went out before), and a
    new message there is delivered too, if flagged."""

    async def scenario() -> None:
        async with (
            open_embedded_store(_config(tmp_path / "a")) as a,
            open_embedded_store(_config(tmp_path / "b")) as b,
        ):
            records = [Record(b"", b"q", b"", b"m%d" % n, ((1, 0),)) for n in range(6)]
            for copy, count in ((a, 6), (b, 2)):
                await copy.create_queue(1, 1)
                await copy.append(records[:count])
            store = _Following(a)
            queue = QueueRuntime(QueueDef(vhost="/", name="q", queue_id=1), cast(Any, store))
            queue.start_leasing()
            queue.fences[0] = 200
            await queue.take_over(0)
            await queue.fill()
            first = [queue.take() for _ in range(6)]
            assert [(bytes(t[1].body), t[2]) for t in first if t is not None] == [
                (b"m%d" % n, False) for n in range(6)
            ]
            store.current = b  # ends at 2: the read past its end finds nothing
            queue.exhausted = False
            await queue.fill()
            assert queue.take() is None
            assert queue.cursors[0] == 2
            # b goes on as master: what it takes next is delivered, not skipped.
            await b.append([Record(b"", b"q", b"", b"n2", ((1, 0),))])
            queue.exhausted = False
            await queue.fill()
            taken = queue.take()
            assert taken is not None and (bytes(taken[1].body), taken[2]) == (b"n2", True)
            store.current = a  # or the old master's copy again: m3.. went out before
            queue.exhausted = False
            await queue.fill()
            again = [queue.take() for _ in range(3)]
            assert [(bytes(t[1].body), t[2]) for t in again if t is not None] == [
                (b"m3", True), (b"m4", True), (b"m5", True)
            ]  # fmt: skip

    anyio.run(scenario)


class _RefusedDuringTakeOver(_Following):
    """The first stats read of a take-over: meanwhile a read with the same token comes back
    refused (another task's: a fill or a long poll), as ``lose_lease`` records it."""

    def __init__(self, current: EmbeddedStore, queue: list[QueueRuntime]) -> None:
        super().__init__(current)
        self.queue = queue

    async def queue_stats(self, queue_id: int, group: str = QUEUE_GROUP) -> Any:
        if self.queue:
            refused = StaleFence("fencing token 200 is stale: token 300 holds it now")
            self.queue.pop().lose_lease(0, refused, 200)
        return await self.current.queue_stats(queue_id, group)


def test_a_take_over_whose_token_is_refused_meanwhile_fails(tmp_path: Path) -> None:
    """Nemesis seed 120: a read with the token being taken over came back refused while the
    take-over ran; the take-over went on with no token (its fenced call then carried 0,
    which a broker does not check) and delivered the partition unfenced beside its holder:
    one message went out from both gateways, unflagged. The take-over fails instead."""

    async def scenario() -> None:
        async with open_embedded_store(_config(tmp_path / "store")) as store:
            await store.create_queue(1, 1)
            await store.committed_offset(QUEUE_GROUP, 1, 0, fence=300)  # the other holder
            pending: list[QueueRuntime] = []
            wrapped = _RefusedDuringTakeOver(store, pending)
            queue = QueueRuntime(QueueDef(vhost="/", name="q", queue_id=1), cast(Any, wrapped))
            queue.start_leasing()
            queue.fences[0] = 200
            pending.append(queue)
            with pytest.raises(StaleFence):
                await queue.take_over(0)
            assert not queue.may_serve()

    anyio.run(scenario)
