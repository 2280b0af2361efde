"""Moving a queue's read positions in bulk, outside delivery: retention (``x-max-age``,
disk-overflow ``drop-oldest``, and what the store's own retention removed before it was
read), queue.purge, and an operator's reset to a time (RocketMQ's resetOffsetByTime).

Each move puts the runtime's exact counts right again: ``ready_count`` from the positions
(or lowered by what was dropped), ``ready_bytes`` by a read pass when the queue has a
max-length-bytes. What the runtime holds in memory is its store layout's business
(``QueueRuntime._drop_held_before`` and ``_held_bytes``, overridden by the priority layout);
what consumers hold unacked stays with them. Nothing here runs per message.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.queues.runtime import QueueRuntime

log = logging.getLogger("mqgw.queue")

READ_BATCH = 256  # messages per read of a byte recount (the runtime's FETCH_BATCH)


def lost_to_retention(queue: QueueRuntime, count: int) -> None:
    """A read found ``count`` unread messages removed by the store's retention."""
    if count <= 0:
        return
    queue.dropped_by_retention += count
    queue.ready_count = max(0, queue.ready_count - count)
    log.warning(
        "queue %r: %d unread message(s) removed by the store's retention (age or disk "
        "budget) before delivery",
        queue.name,
        count,
    )


async def recount_bytes(queue: QueueRuntime) -> None:
    """Sum the bodies of the ready messages (a read pass; only for byte-limited queues)."""
    total = await queue._held_bytes()
    for p in range(queue.partitions):
        offset = queue.cursors[p]
        while True:
            result = await queue.store.read(queue.queue_id, p, offset, READ_BATCH)
            if not result.messages:
                break
            total += sum(len(m.body) for m in result.messages)
            offset = result.next_offset
    queue.ready_bytes = total


async def drop_stored_before(queue: QueueRuntime, cut_ts_ms: int, why: str) -> int:
    """Ready messages stored before ``cut_ts_ms`` leave without dead-lettering, as
    retention (x-max-age, disk-overflow drop-oldest); unacked ones stay with their
    consumers. Counted in dropped_by_retention and logged."""
    dropped, bytes_known = await queue._drop_held_before(cut_ts_ms)
    skipped = 0
    for p in range(queue.partitions):
        target = await queue.store.offset_for_time(queue.queue_id, p, cut_ts_ms)
        if target > queue.cursors[p]:
            skipped += target - queue.cursors[p]
            queue.cursors[p] = target
    dropped += skipped
    if not dropped:
        return 0
    queue.ready_count = max(0, queue.ready_count - dropped)
    queue.dropped_by_retention += dropped
    queue.commit_dirty = True
    if (skipped or not bytes_known) and queue.behaviour.max_length_bytes is not None:
        await queue.recount_bytes()
    log.warning("queue %r: %d unread message(s) dropped: %s", queue.name, dropped, why)
    return dropped


async def reset_to_time(queue: QueueRuntime, ts_ms: int) -> list[tuple[int, int]]:
    """RocketMQ's resetOffsetByTime: each partition is read again from its first message
    stored at or after ``ts_ms`` (what lies before is skipped, what was consumed after
    is replayed). Returns (from, to) offsets per partition. What consumers hold unacked
    stays with them (and may come again if the reset replays it)."""
    moves = []
    before = queue.committed_offsets()
    for p in range(queue.partitions):
        target = await queue.store.offset_for_time(queue.queue_id, p, ts_ms)
        moves.append((before[p], target))
    queue.clear_held()
    queue.returns.clear()
    queue.cursors = [to for _, to in moves]
    stats = await queue.store.queue_stats(queue.queue_id)
    queue.ready_count = sum(
        max(0, s.max_offset - queue.cursors[s.partition]) for s in queue.known(stats.partitions)
    )
    queue.exhausted = False
    queue.commit_dirty = True
    if queue.behaviour.max_length_bytes is not None:
        await queue.recount_bytes()
    await queue.commit()
    return moves


async def purge(queue: QueueRuntime) -> int:
    """queue.purge: every ready message goes; returns how many."""
    count = queue.ready_count
    purged = await queue.store.purge(queue.queue_id)
    if not queue.holds_all_leases():  # cluster: another gateway delivers; the broker knows
        count = purged
    queue.clear_held()
    stats = await queue.store.queue_stats(queue.queue_id)
    queue.cursors = [s.max_offset for s in queue.known(stats.partitions)]
    queue.ready_count = queue.ready_bytes = 0
    queue.dropped += count
    queue.commit_dirty = True
    return count
