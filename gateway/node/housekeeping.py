"""The node's once-a-second duties, each a function of what it touches: commit the queues'
positions, apply the explicit retention choices (x-max-age, disk-overflow drop-oldest), start
queues whose broker group is back, and retry what the metadata store refused while it was
away (exclusive queues of closed connections, connection counts, a write a full disk held).
``Node.housekeeping`` runs them in turn; a step whose store calls fail runs again next time.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableSet

import anyio

from gateway.features.broadcast import Broadcasts
from gateway.features.log_timer import LogTimer
from gateway.queues.runtime import QueueRuntime
from gateway.resources.alarms import ResourceAlarm
from gateway.vhost import VirtualHost
from meta.errors import MetadataUnavailable
from meta.store import MetadataStore
from storage import StoreError, StorePort

log = logging.getLogger("mqgw.node")

COMMIT_INTERVAL_S = 1.0
COMMIT_YIELD_EVERY = 256
STORE_AWAY_LOG_EVERY_S = 10.0  # while store calls fail (a broker away): a line this often


async def commit_offsets(
    vhosts: Mapping[str, VirtualHost], broadcasts: Broadcasts, timer: LogTimer
) -> None:
    """Commit every queue's position that moved. A queue whose broker is away stays due
    (the next pass commits it) and the others go on; StoreError, the last such error,
    after the pass."""
    committed = 0
    away: StoreError | None = None
    for vhost in vhosts.values():
        for queue in list(vhost.queues.values()):
            if queue.commit_dirty:
                try:
                    await queue.commit()
                except StoreError as error:
                    away = error
                committed += 1
                if committed % COMMIT_YIELD_EVERY == 0:
                    # 10,000 busy queues: let deliveries run between slices of the pass
                    await anyio.lowlevel.checkpoint()
    await broadcasts.commit()
    await timer.commit()
    if away is not None:
        raise away


async def start_waiting_queues(vhosts: Mapping[str, VirtualHost]) -> None:
    for vhost in list(vhosts.values()):
        await vhost.start_waiting()


async def clean_owners(
    meta: MetadataStore,
    vhosts: Mapping[str, VirtualHost],
    owners_to_clean: MutableSet[str],
    connections_to_uncount: MutableSet[tuple[str, str]],
) -> None:
    """What connections closed while the metadata store was away left there: their
    exclusive queues, and their counts against the vhost limits."""
    for owner in list(owners_to_clean):
        try:
            deletions = await meta.delete_exclusive_queues(owner)
        except MetadataUnavailable:
            return  # still away: next round
        owners_to_clean.discard(owner)
        for vhost in vhosts.values():
            await vhost.apply_deletions(deletions)
    for vhost_name, connection_id in list(connections_to_uncount):
        try:
            await meta.close_connection(vhost_name, connection_id)
        except MetadataUnavailable:
            return
        connections_to_uncount.discard((vhost_name, connection_id))


async def retry_metadata_write(meta: MetadataStore) -> None:
    """Write the metadata a full disk kept in memory (nothing to do when none waits)."""
    try:
        await meta.retry_write()
    except Exception:
        log.exception("metadata write failed; retrying in %.0f s", COMMIT_INTERVAL_S)


async def apply_queue_retention(
    vhosts: Mapping[str, VirtualHost], store: StorePort, disk_alarm: ResourceAlarm, now_ms: int
) -> None:
    """The explicit choices to drop unread data: x-max-age, and disk-overflow drop-oldest
    while the disk alarm is on (a queue's messages in the oldest commitlog segment go, so
    that reclaim can delete it). Every other queue keeps its messages until consumed."""
    drop_oldest: list[QueueRuntime] = []
    for vhost in vhosts.values():
        for queue in list(vhost.queues.values()):
            behaviour = queue.behaviour
            if behaviour.max_age_ms is not None and queue.ready_count:
                await queue.drop_stored_before(
                    now_ms - behaviour.max_age_ms,
                    f"older than x-max-age ({behaviour.max_age_ms} ms)",
                )
            if behaviour.disk_overflow == "drop-oldest" and queue.ready_count:
                drop_oldest.append(queue)
    if not drop_oldest or not disk_alarm.blocked:
        return
    oldest = await store.oldest_segment_ts()
    if oldest is None:
        return
    for queue in drop_oldest:
        await queue.drop_stored_before(
            oldest + 1, "disk-overflow drop-oldest: the disk alarm is on"
        )
