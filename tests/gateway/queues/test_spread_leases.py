"""A queue spread over the gateways (gateway/cluster/delivery_spread.py) as one gateway's
runtime sees it, over a real embedded store: it wants every n-th partition of its slot (an
opening one only through the lead's holder), serves with any one lease, reads only the
partitions it holds, and a message met at the head while its partition's lease is being
given up is parked: not delivered, and the commit does not pass it (a run of the cluster
test lost two messages that way: the final commit before the hand-over went past them)."""

from __future__ import annotations

from pathlib import Path

import anyio

from gateway.queues.runtime import QueueRuntime
from meta.models import QueueDef
from storage import EmbeddedStore, Record, open_embedded_store
from tests.gateway.queues.test_push_scheduler import _config


def test_a_slot_wants_its_partitions_and_serves_with_any_lease(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with open_embedded_store(_config(tmp_path / "store")) as store:
            await store.create_queue(1, 4)
            queue = QueueRuntime(QueueDef(vhost="/", name="q", queue_id=1, partitions=4), store)
            queue.consumers.append(object())  # type: ignore[arg-type]  # (only counted)
            queue.start_leasing()
            assert [queue.wants_partition(p) for p in range(4)] == [True] * 4  # no slot yet
            queue.delivery_slot = (1, 2)
            assert [queue.wants_partition(p) for p in range(4)] == [False, True, False, True]
            assert not queue.may_serve()
            queue.fences[1] = 5
            await queue.take_over(1)
            assert queue.may_serve()  # one lease of its own is enough
            await store.append([Record(b"", b"q", b"", b"m%d" % p, ((1, p),)) for p in range(4)])
            await queue.fill()
            assert [p for p, _ in queue.buffer] == [1]  # only what it holds is read

    anyio.run(scenario)


async def _holding_both(store: EmbeddedStore) -> QueueRuntime:
    """A queue of two partitions whose one slot (of one) holds both leases."""
    await store.create_queue(1, 2)
    queue = QueueRuntime(QueueDef(vhost="/", name="q", queue_id=1, partitions=2), store)
    queue.start_leasing()
    queue.delivery_slot = (0, 1)
    for p in (0, 1):
        queue.fences[p] = 5
        await queue.take_over(p)
    return queue


def test_a_message_whose_lease_is_going_is_parked_not_delivered_nor_passed(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with open_embedded_store(_config(tmp_path / "store")) as store:
            queue = await _holding_both(store)
            records = [Record(b"", b"q", b"", b"m%d-%d" % (p, n), ((1, p),))
                       for n in range(3) for p in (0, 1)]  # fmt: skip
            await store.append(records)
            await queue.fill()
            queue.set_lease(1, False)  # its give-up began (the commit and hand-over follow)
            taken = [queue.take() for _ in range(6)]
            out = [(t[0], bytes(t[1].body)) for t in taken if t is not None]
            assert out == [(0, b"m0-0"), (0, b"m0-1"), (0, b"m0-2")]
            assert queue.committed_offsets()[1] == 0  # nothing of partition 1 went out
            queue.set_lease(1, True)  # the commit failed: the lease is kept after all
            back = [queue.take() for _ in range(3)]
            assert [(t[0], bytes(t[1].body), t[2]) for t in back if t is not None] == [
                (1, b"m1-0", True), (1, b"m1-1", True), (1, b"m1-2", True)]  # fmt: skip

    anyio.run(scenario)


def test_a_partition_leaving_is_neither_read_nor_delivered_yet_commits(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with open_embedded_store(_config(tmp_path / "store")) as store:
            queue = await _holding_both(store)
            await store.append([Record(b"", b"q", b"", b"m%d-0" % p, ((1, p),)) for p in (0, 1)])
            await queue.fill()
            first = [queue.take() for _ in range(2)]
            assert {t[0] for t in first if t is not None} == {0, 1}  # one of each went out
            queue.leaving.add(1)  # the split changed: partition 1 settles, then goes
            await store.append([Record(b"", b"q", b"", b"m%d-1" % p, ((1, p),)) for p in (0, 1)])
            await queue.fill()
            assert [(p, bytes(m.body)) for p, m in queue.buffer] == [(0, b"m0-1")]  # 1 unread
            taken = queue.take()
            assert taken is not None and bytes(taken[1].body) == b"m0-1"
            assert queue.committed_offsets()[1] == 0  # m1-0 is still out
            queue.settle(1, next(t[1] for t in first if t is not None and t[0] == 1))
            assert queue.committed_offsets()[1] == 1  # settled: the commit moves, the lease
            assert queue.holds_lease(1)  # is still here to make it
            assert await queue.hand_over(1) == 1  # the next holder starts at m1-1
            assert not queue.leaving

    anyio.run(scenario)
