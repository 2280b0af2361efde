"""A delivering gateway whose lease another gateway took over reads nothing more to deliver
(found by the nemesis run, seed 4: a gateway cut off from Redis and the brokers came back,
went on reading and delivering for a moment after the new holder had begun, and the same
messages went out twice, the second time without the redelivered flag). Its reads carry
its fencing token; the broker refuses them once a higher token holds the partition."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from gateway.queues.runtime import QueueRuntime
from meta.models import QueueDef
from storage import QUEUE_GROUP, QueueStats, ReadResult, Record, open_embedded_store
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


class _TwoCopies:
    """A group store's view of two copies of one partition (nemesis seed 107: Redis's
    failover took an election back, and the gateways followed two masters for a moment):
    reads and stats go to ``current``, tagged with its ``source`` as GroupStore tags them."""

    def __init__(self, current: EmbeddedStore, source: int) -> None:
        self.current, self.source = current, source

    def __getattr__(self, name: str) -> Any:
        return getattr(self.current, name)

    async def read(self, *args: Any, **kwargs: Any) -> ReadResult:
        return (await self.current.read(*args, **kwargs))._replace(source=self.source)

    async def queue_stats(self, queue_id: int, group: str = QUEUE_GROUP) -> QueueStats:
        stats = await self.current.queue_stats(queue_id, group)
        parts = [part._replace(source=self.source) for part in stats.partitions]
        return stats._replace(partitions=parts)


def test_a_new_copy_flags_what_a_replaced_holder_may_have_read_there(tmp_path: Path) -> None:
    """The new holder takes the partition over on one copy; the replaced holder, following
    the other, delivers from it before the new holder's fence reaches it. When the new holder
    reads from that copy, what lay there is flagged redelivered; what comes after is not."""

    async def scenario() -> None:
        async with (
            open_embedded_store(_config(tmp_path / "a")) as a,
            open_embedded_store(_config(tmp_path / "b")) as b,
        ):
            records = [Record(b"", b"q", b"", b"m%d" % n, ((1, 0),)) for n in range(4)]
            for copy in (a, b):
                await copy.create_queue(1, 1)
                await copy.append(records)
            store = _TwoCopies(a, source=1)
            queue = QueueRuntime(QueueDef(vhost="/", name="q", queue_id=1), cast(Any, store))
            queue.start_leasing()
            queue.fences[0] = 200
            await queue.take_over(0)  # on copy a, which nobody held: nothing flagged there
            old = await b.read(1, 0, 0, 10, fence=100)  # the replaced holder, on copy b
            assert len(old.messages) == 4
            store.current, store.source = b, 2
            await queue.fill()
            await b.append([Record(b"", b"q", b"", b"m4", ((1, 0),))])
            queue.exhausted = False
            await queue.fill()
            taken = [queue.take() for _ in range(5)]
            flags = [(t[1].body, t[2]) for t in taken if t is not None]
            assert flags == [(b"m0", True), (b"m1", True), (b"m2", True), (b"m3", True),
                             (b"m4", False)]  # fmt: skip
            with pytest.raises(StaleFence):  # and the replaced holder reads no more there
                await b.read(1, 0, 4, 10, fence=100)

    anyio.run(scenario)
