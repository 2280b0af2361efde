"""The store a broker of a replicated group serves: the embedded store, gated by its role.

The role comes only from the controller's group record (storage/replication/member.py follows
it); docs/controller.md, "The contract", is the rule book and meta/groups/contract.py its pure
helpers, which this module uses as the simulation's brokers do.

As **master** it appends, serves its slaves' fetches (storage/replication/replica_log.py chunks) and
confirms an offset once it is durable here and, in ``sync`` mode, acknowledged by every replica
``InSyncTracker.required()`` names, while its standing holds and it is not fenced. Appends and
their confirms are refused (``NotMaster``) when it cannot confirm; reads stop at the confirm
offset, so a consumer never sees what a failover could take back. In ``async`` mode it confirms
after its own flush: what the slaves had not fetched when it died is lost (docs/replication.md).

As **slave** (or with no role yet) it refuses every call from gateways with ``NotMaster``: a
gateway looks up the master and retries there. Batches carry ids so that a retried append is
stored once (the ids of recent batches travel with the chunks to the slaves).
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from storage.record import Record
from storage.replication.serving import SlaveServing
from storage.replication.settings import ReplicationMode
from storage.results import (
    QUEUE_GROUP,
    AppendResult,
    DeliveryProgress,
    QueueStats,
    ReadResult,
    ReadStatus,
    RetentionReport,
)

REMEMBERED_BATCHES = 65_536  # batch ids kept for idempotent re-sends


class ReplicatedStore(SlaveServing):
    """StorePort of a replicated broker (see the module doc): the role, standing and confirm
    offset are ``ReplicaRole``'s (storage/replication/role.py), the slaves' calls
    ``SlaveServing``'s (storage/replication/serving.py)."""

    async def append(
        self,
        records: Sequence[Record],
        wait_durable: bool = True,
        batch_id: int = 0,
        refused: Sequence[tuple[int, int, int]] | None = None,
    ) -> AppendResult:
        """``refused``: what the broker took out of the batch (closed partitions, length
        limits), remembered with the batch id so that a re-send is refused the same way."""
        self._master_only("append")
        known = self.known_batch(batch_id)
        if known is not None:
            result = known  # a re-send of a batch this log holds: stored once
        else:
            result = await self.inner.append(records, wait_durable=False)
            if batch_id:
                self._remember(batch_id, result._replace(refused=tuple(refused or ())))
            self._note_appended()
        if wait_durable:
            await self.wait_durable(result.end_offset)
        return result

    def known_batch(self, batch_id: int) -> AppendResult | None:
        """What a batch this log holds was answered (its refusals included); None when the
        id is 0, unknown, or its records were truncated away."""
        known = self.batches.get(batch_id) if batch_id else None
        if known is not None and known.end_offset <= self.log.commit_log.write_offset:
            return known
        return None

    def _remember(self, batch_id: int, result: AppendResult) -> None:
        self.batches[batch_id] = AppendResult(
            result.start_offset, result.end_offset, result.record_count, refused=result.refused
        )
        while len(self.batches) > REMEMBERED_BATCHES:
            self.batches.popitem(last=False)

    async def wait_durable(self, end_offset: int) -> None:
        """Returns once this master has confirmed up to ``end_offset`` in the term it was
        asked in. A broker that is not master, or stopped being master meanwhile, refuses
        (the gateway sends the batch again to the new master): once a slave, its log may be
        cut back and its confirm offset raised by the new master's entries, so the offsets
        no longer say anything about this batch (found by the nemesis run, seed 7: such a
        wait returned, and two confirmed messages were lost)."""
        if self.role != "master":
            raise self._refuse("confirm")
        epoch = self.role_epoch
        end_offset = min(end_offset, self.log.commit_log.write_offset)
        while True:
            if self.role != "master" or self.role_epoch != epoch:
                raise self._refuse("confirm")
            if self.confirmed >= end_offset:
                return  # (confirmed before a switchover's fence: durable all the same)
            if self.fenced_version:
                raise self._refuse("confirm")
            changed = self._changed
            with anyio.move_on_after(self.settings.timing.heartbeat_interval_ms / 1000):
                await changed.wait()

    async def backlog_bytes(self) -> int:
        return self.log.commit_log.written_past(self.confirmed)

    async def read(
        self, queue_id: int, partition: int, offset: int, max_count: int = 256,
        max_bytes: int = 4 << 20, wait_ms: int = 0, fence: int = 0,
    ) -> ReadResult:  # fmt: skip
        if self.role != "master":
            raise self._refuse("read")
        result = await self.inner.read(
            queue_id, partition, offset, max_count, max_bytes, fence=fence
        )
        limit = self.confirmed
        messages = result.messages
        if not messages or messages[-1].commit_offset < limit:
            return result
        kept = [m for m in messages if m.commit_offset < limit]
        status = result.status
        if not kept and status is ReadStatus.FOUND:
            status = ReadStatus.NO_NEW_MESSAGE
        start = messages[0].queue_offset
        end = start + len(kept)
        return result._replace(status=status, messages=kept, next_offset=end, max_offset=end)

    async def create_queue(self, queue_id: int, partitions: int) -> None:
        """Answered once the in-sync replicas hold the registry with it (sync mode): a master
        lost right after would otherwise leave a new master without the queue or its new
        partitions, and appends re-sent there would be indexed nowhere."""
        self._master_only("queue declaration")
        known = self.log.registry.queues.get(queue_id)
        before = 0 if known is None else known.partitions  # (create_queue grows it in place)
        await self.inner.create_queue(queue_id, partitions)
        if before >= partitions:
            return  # nothing changed (a redeclare)
        self.registry_version += 1
        await self._registry_replicated("queue declaration")

    async def _registry_replicated(self, what: str) -> None:
        if self.settings.mode is not ReplicationMode.SYNC:
            return
        version = self.registry_version
        self._note_appended()  # a fetch held for data answers now, with the registry
        while True:
            if self.role != "master" or self.fenced_version:
                raise self._refuse(what)
            required = self.in_sync.required()
            if all(self.registry_acks.get(r, 0) >= version for r in required):
                return
            changed = self._changed
            with anyio.move_on_after(self.settings.timing.heartbeat_interval_ms / 1000):
                await changed.wait()

    async def queues(self) -> dict[int, int]:
        return await self.inner.queues()

    async def delete_queue(self, queue_id: int) -> None:
        self._master_only("queue deletion")
        await self.inner.delete_queue(queue_id)
        self.registry_version += 1

    async def purge(self, queue_id: int, group: str = QUEUE_GROUP) -> int:
        self._master_only("purge")
        purged = await self.inner.purge(queue_id, group)
        self.registry_version += 1
        return purged

    async def queue_stats(self, queue_id: int, group: str = QUEUE_GROUP) -> QueueStats:
        return await self.inner.queue_stats(queue_id, group)

    async def commit_offset(
        self,
        group: str,
        queue_id: int,
        partition: int,
        offset: int,
        fence: int = 0,
        progress: DeliveryProgress | None = None,
    ) -> None:
        if self.role != "master":
            raise self._refuse("offset commit")
        await self.inner.commit_offset(group, queue_id, partition, offset, fence, progress)
        for dirty in self.dirty_offsets.values():
            dirty.add((group, queue_id, partition))

    async def committed_offset(
        self, group: str, queue_id: int, partition: int, fence: int = 0
    ) -> int:
        if fence:  # registers the fence: a write, replicated with the offsets
            if self.role != "master":
                raise self._refuse("fenced offset read")
            offset = await self.inner.committed_offset(group, queue_id, partition, fence)
            for dirty in self.dirty_offsets.values():
                dirty.add((group, queue_id, partition))
            return offset
        return await self.inner.committed_offset(group, queue_id, partition)

    def set_append_limit(
        self, queue_id: int, max_length: int | None, max_length_bytes: int | None = None
    ) -> None:
        """Limits come with each append (the gateway's store sends them)."""

    async def offset_for_time(self, queue_id: int, partition: int, ts_ms: int) -> int:
        return await self.inner.offset_for_time(queue_id, partition, ts_ms)

    async def apply_retention(self) -> RetentionReport:
        report = await self.inner.apply_retention()
        self.registry_version += 1  # floors and drop counts may have moved
        return report

    async def disk_bytes(self) -> int:
        return await self.inner.disk_bytes()

    async def held_back_bytes(self) -> dict[int, int]:
        return await self.inner.held_back_bytes()

    async def oldest_segment_ts(self) -> int | None:
        return await self.inner.oldest_segment_ts()

    async def restart_marks(self, queue_id: int) -> dict[int, int]:
        return await self.inner.restart_marks(queue_id)

    async def unclean_marks(self, queue_id: int) -> dict[int, int]:
        return await self.inner.unclean_marks(queue_id)
