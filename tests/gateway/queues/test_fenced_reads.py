"""A delivering gateway whose lease another gateway took over reads nothing more to deliver
(found by the nemesis run, seed 4: a gateway cut off from Redis and the brokers came back,
went on reading and delivering for a moment after the new holder had begun, and the same
messages went out twice, the second time without the redelivered flag). Its reads carry
its fencing token; the broker refuses them once a higher token holds the partition."""

from __future__ import annotations

from pathlib import Path

import anyio

from gateway.queues.runtime import QueueRuntime
from meta.models import QueueDef
from storage import QUEUE_GROUP, Record, open_embedded_store
from storage.errors import StaleFence
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
