"""The parts of a delivery lease hand-over (issue 32), each on its own: the note a holder
leaves in Redis when it gives a lease up and the next holder receives when it takes it, the
request and answer by which a gateway asks a holder for its leases, and what a queue
runtime flags redelivered after taking a partition over (the note checked against the
broker's highest fence) and hands on when it gives one up.

Before, a take-over flagged everything stored up to the end as possibly delivered, the
first one on a queue nobody had ever delivered included."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from gateway.queues.runtime import QueueRuntime
from meta.cluster import HandedNote, token_counter
from meta.models import QueueDef
from meta.redis_store import RedisMetadataStore
from storage import QUEUE_GROUP, FlushPolicy, Record, StoreConfig, open_embedded_store
from storage.log.embedded import EmbeddedStore

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]


async def test_a_lease_changes_hands_with_the_note_its_holder_left(
    meta: RedisMetadataStore,
) -> None:
    first = await meta.take_lease("q:1:0", "gw-a", 5000)
    assert (first.mine, first.taken, first.handed) == (True, True, None)  # nobody before
    again = await meta.take_lease("q:1:0", "gw-a", 5000)
    assert (again.mine, again.taken, again.token) == (True, False, first.token)  # renewed
    refused = await meta.take_lease("q:1:0", "gw-b", 5000)
    assert (refused.mine, refused.holder, refused.token) == (False, "gw-a", first.token)
    await meta.drop_lease("q:1:0", "gw-b", 99)  # not the holder: no effect, no note
    await meta.drop_lease("q:1:0", "gw-a", 7)
    taken = await meta.take_lease("q:1:0", "gw-b", 200)
    assert taken.taken and taken.token > first.token
    assert taken.handed == HandedNote(first.token, 7)  # the mark, and whose it was
    # gw-b lets it lapse: the next holder learns who held it, and that no mark was left.
    await anyio.sleep(0.3)
    after_lapse = await meta.take_lease("q:1:0", "gw-a", 5000)
    assert after_lapse.handed == HandedNote(taken.token, None)
    await meta.drop_lease("q:1:0", "gw-a")  # given up without a mark: none for the next
    assert (await meta.take_lease("q:1:0", "gw-b", 5000)).handed == HandedNote(
        after_lapse.token, None
    )
    again = await meta.hold_lease("q:1:0", "gw-b", 5000)
    assert again is not None and token_counter(again) == token_counter(after_lapse.token) + 1


async def test_a_hand_over_request_reaches_the_holder_and_its_answer_the_asker(
    meta: RedisMetadataStore,
) -> None:
    async def holder(answered: list[tuple[str, ...]]) -> None:
        requests = await meta.hand_over_requests("gw-a", 5.0)
        for request in requests:
            answered.append(request.names)
            await meta.answer_hand_over(request.request_id, "released")

    answered: list[tuple[str, ...]] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(holder, answered)
        answer = await meta.ask_hand_over("gw-a", ["q:1:0", "q:1:1"], "gw-b/1", 5.0)
    assert answer == "released"
    assert answered == [("q:1:0", "q:1:1")]
    # Nobody answers (the holder is gone): the asker stops waiting after its bound.
    with anyio.fail_after(3):
        assert await meta.ask_hand_over("gw-c", ["q:1:0"], "gw-b/2", 0.2) is None
    assert await meta.hand_over_requests("gw-x", 0.05) == []  # none: an empty wait


async def _queue_with(store: EmbeddedStore, messages: int) -> QueueRuntime:
    await store.create_queue(1, 1)
    records = [Record(b"", b"q", b"", b"%d" % n, ((1, 0),)) for n in range(messages)]
    await store.append(records, wait_durable=False)
    queue = QueueRuntime(QueueDef(vhost="/", name="q", queue_id=1), store)
    await queue.start()
    queue.leases = [False]
    return queue


async def _take_over(queue: QueueRuntime, token: int, handed: HandedNote | None) -> list[bool]:
    """Take partition 0 over with ``token``; the redelivered flags of what is left."""
    queue.fences[0] = token
    await queue.take_over(0, handed)
    flags = []
    while (taken := await queue.get()) is not None:
        flags.append(taken[2])
        queue.settle(taken[0], taken[1])
    return flags


@pytest.mark.parametrize(
    ("fence", "note", "flagged"),
    [
        (0, None, 0),  # nobody ever took it over: nothing was delivered
        (7, HandedNote(7, 3), 3),  # its holder gave it up: what it had out, below 3
        (7, HandedNote(7, None), 6),  # its holder let it lapse: anything may have gone out
        (7, None, 6),  # the note is gone (Redis lost it, it expired): the same
        (9, HandedNote(7, 3), 6),  # someone (token 9) took it after the note: the same
        (0, HandedNote(7, 3), 6),  # the broker forgot the fence (a failover): the same
    ],
)
async def test_a_take_over_flags_what_the_note_says_went_out(
    tmp_path: Path, fence: int, note: HandedNote | None, flagged: int
) -> None:
    async with open_embedded_store(StoreConfig(tmp_path, flush=FlushPolicy.ASYNC)) as store:
        queue = await _queue_with(store, 6)
        await store.commit_offset(QUEUE_GROUP, 1, 0, 1, fence)  # one settled before
        flags = await _take_over(queue, 10, note)
        assert flags == [n < flagged for n in range(1, 6)]


async def test_a_holder_hands_on_what_it_had_out(tmp_path: Path) -> None:
    """Delivered and requeued (a get not acked, its channel closed): below the mark, as what
    the holder before had out; read and not delivered: not."""
    async with open_embedded_store(StoreConfig(tmp_path, flush=FlushPolicy.ASYNC)) as store:
        queue = await _queue_with(store, 6)
        queue.fences[0] = 4
        await store.commit_offset(QUEUE_GROUP, 1, 0, 0, 3)  # the holder before: token 3
        await queue.take_over(0, HandedNote(3, 3))  # it had offsets below 3 out
        first = await queue.get()
        second = await queue.get()
        assert first is not None and second is not None
        queue.settle(first[0], first[1])
        queue.requeue(second[0], second[1])  # offset 1 went out, came back
        assert queue.buffer  # offsets 2.. read, not delivered
        queue.set_lease(0, False)
        assert await queue.commit_partition(0)
        assert await store.committed_offset(QUEUE_GROUP, 1, 0) == 1
        assert await queue.hand_over(0) == 3  # its own (below 2) and the one before's
        assert (queue.cursors[0], list(queue.buffer), queue.requeued) == (1, [], [])
        # A late commit here (a settle after the hand-over) moves nothing: not held.
        queue.commit_dirty = True
        await queue.commit()
        await store.commit_offset(QUEUE_GROUP, 1, 0, 3, 5)  # the next holder's progress
        await queue.commit()
        assert await store.committed_offset(QUEUE_GROUP, 1, 0) == 3
