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

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import anyio

from meta.groups.contract import Grants, InSyncTracker, Standing
from meta.groups.records import GroupRecord, LagReport, Role
from meta.groups.timing import ControllerConfig
from storage.config import FlushPolicy
from storage.errors import NotMaster, StoreError
from storage.log.embedded import EmbeddedStore
from storage.record import Record
from storage.replication.confirm_windows import ConfirmWindows, wall_stamp
from storage.replication.replica_log import read_chunk
from storage.replication.state import ReplicationState
from storage.results import (
    QUEUE_GROUP,
    AppendResult,
    DeliveryProgress,
    QueueStats,
    ReadResult,
    ReadStatus,
    RetentionReport,
)
from storage.wire.replication import Replicated

log = logging.getLogger("mqgw.storage.replication")

REMEMBERED_BATCHES = 65_536  # batch ids kept for idempotent re-sends


class ReplicationMode(StrEnum):
    SYNC = "sync"
    ASYNC = "async"


@dataclass(frozen=True)
class ReplicationSettings:
    group: str
    broker_id: str
    mode: ReplicationMode = ReplicationMode.SYNC
    timing: ControllerConfig = field(default_factory=ControllerConfig)
    priority: int = 0
    fetch_bytes: int = 4 << 20
    fetch_wait_ms: int = 200
    # Standing from the in-sync replicas' promises when Redis does not answer (rule 14 in
    # docs/controller.md): safe only when min_in_sync is a majority of the group.
    replica_standing: bool = False


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class ReplicatedStore:
    """StorePort of a replicated broker (see the module doc)."""

    def __init__(
        self,
        inner: EmbeddedStore,
        state: ReplicationState,
        settings: ReplicationSettings,
        clock_ms: Any = monotonic_ms,
    ) -> None:
        self.inner = inner
        self.log = inner.log
        self.state = state
        self.settings = settings
        self.me = settings.broker_id
        self.now_ms = clock_ms
        self.sync_flush = inner.config.flush is FlushPolicy.SYNC
        self.role: Role = "none"
        self.role_epoch = 0
        self.standing = Standing()
        # The replicas' promises (replica_standing): standing when Redis does not answer.
        self.grants = Grants()
        self.fenced_version = 0
        self._lost_logged = False
        self.windows = ConfirmWindows(self.me)
        self.confirmed = 0
        self.in_sync = InSyncTracker(self.me)
        self.min_in_sync = settings.timing.min_in_sync
        self.acks: dict[str, int] = {}
        self.progress: dict[str, int] = {}  # local ms a replica last kept up
        self.batches: OrderedDict[int, AppendResult] = OrderedDict()
        self.registry_version = 1
        self.registry_acks: dict[str, int] = {}  # per replica: the registry version it applied
        self.dirty_offsets: dict[str, set[tuple[str, int, int]]] = {}  # per replica
        self._changed = anyio.Event()  # confirm offset or role moved
        self._data = anyio.Event()  # set (and replaced) on each append: fetches, flusher

    # -- role (called by the member on each group record it follows) ------------------------

    def can_confirm(self) -> bool:
        if self.role != "master" or self.fenced_version:
            return False
        now = self.now_ms()
        return self.standing.valid(now) or self._granted(now)

    def _granted(self, now: int) -> bool:
        """Standing from the replicas: every replica this master needs acknowledgements
        from promised, after a moment it knows (``echo_ms``), to follow no other master for
        ``master_timeout_ms``; none of them can be elected and confirm before that runs out,
        and with min_in_sync a majority, no master without them can confirm at all."""
        if not self.settings.replica_standing or self.settings.mode is not ReplicationMode.SYNC:
            return False
        return self.grants.cover(self.in_sync.required(), self.min_in_sync, now)

    def accepting(self) -> bool:
        return self.can_confirm() and 1 + len(self.in_sync.stored) >= self.min_in_sync

    def become_master(self, record: GroupRecord) -> None:
        self.step_down()
        end = self.log.commit_log.write_offset
        self.state.begin_term(record.epoch, end)
        self.state.save()  # persisted before acting as master (rule 6)
        self.role, self.role_epoch = "master", record.epoch
        self.in_sync = InSyncTracker(self.me, record.in_sync - {self.me}, end)
        # Members kept from the old set get one lag timeout to reach the new master.
        self.progress = dict.fromkeys(sorted(self.in_sync.stored), self.now_ms())
        # What this log holds was confirmed by no one yet in this term: the first confirm
        # comes once the in-sync replicas acknowledge it.
        self.confirmed = min(self.confirmed, end)
        log.info("broker %s is master at epoch %d from offset %d", self.me, record.epoch, end)
        self._wake()
        self._note_appended()  # the flusher makes the inherited tail durable

    def become_slave(self, epoch: int) -> None:
        if self.role == "master":
            self.step_down()
        self.role, self.role_epoch = "slave", epoch

    def diverge(self, epoch: int) -> None:
        """It will not follow the master of ``epoch``: that would cut confirmed entries."""
        self.role, self.role_epoch = "diverged", epoch

    def step_down(self) -> None:
        self.windows.closed("stepped down")
        if self.role == "master":
            log.info("broker %s stops acting as master (epoch %d)", self.me, self.role_epoch)
        self.role, self.role_epoch = "none", 0
        self.standing.revoke()
        self.grants.revoke()
        self.fenced_version = 0
        self.in_sync = InSyncTracker(self.me)
        self.acks, self.progress, self.dirty_offsets = {}, {}, {}
        self._wake()

    def follow_standing(self, record: GroupRecord, answered_seq: int, sent_ms: int) -> None:
        """As master: the record answered heartbeat ``answered_seq`` sent at ``sent_ms``."""
        self.in_sync.on_record(record.in_sync, answered_seq)
        if record.fence:
            self.fenced_version = record.fence_version
            self.standing.revoke()
            self.grants.revoke()  # and its answers say so: the replicas drop their promises
            self.windows.closed("fenced")
        else:
            self.fenced_version = 0
            self.standing.grant(sent_ms, self.settings.timing.master_timeout_ms)
            self._lost_logged = False
        self.confirm()

    def review(self, seq: int) -> LagReport:
        lagging = self.in_sync.review(
            self.acks, self.progress, self.log.commit_log.write_offset, self.confirmed,
            self.now_ms(), self.settings.timing.lag_timeout_ms, seq,
        )  # fmt: skip
        return LagReport(
            self.settings.group, self.me, self.role_epoch, lagging, self.in_sync.asked()
        )

    # -- confirming -------------------------------------------------------------------------

    def local_durable(self) -> int:
        if self.sync_flush:
            return self.log.durable_offset
        return self.log.commit_log.write_offset

    def confirm(self) -> None:
        if not self.can_confirm():
            self.windows.closed("standing ran out" if self.role == "master" else "not master")
            self._note_lost_standing()
            return
        offset = self.local_durable()
        if self.settings.mode is ReplicationMode.SYNC:
            required = self.in_sync.required()
            if 1 + len(required) < self.min_in_sync:
                return
            for replica in required:
                offset = min(offset, self.acks.get(replica, 0))
        if offset > self.confirmed:
            self.confirmed = offset
            self.windows.confirmed(self.role_epoch, offset)
            self._wake()

    def _note_lost_standing(self) -> None:
        """Log once per term when the standing ran out (Redis unreachable): from then on this
        master confirms nothing, before the controller may elect another (rule 7)."""
        until = self.standing.until_ms
        if self.role != "master" or self.fenced_version or not until or self._lost_logged:
            return
        self._lost_logged = True
        stamp = wall_stamp(self.windows.wall_s() - (self.now_ms() - until) / 1000)
        log.warning(
            "broker %s: standing as master ran out at %s (no heartbeat answer): "
            "confirming nothing until the controller answers", self.me, stamp,
        )  # fmt: skip

    def changed_event(self) -> anyio.Event:
        """Set when the confirm offset or the role moves next (held reads wait on it)."""
        return self._changed

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _note_appended(self) -> None:
        self._data.set()
        self._data = anyio.Event()

    async def flush_forever(self) -> None:
        """As master: make what was appended durable here (group commit), then confirm."""
        while True:
            data = self._data
            if self.role == "master":
                if self.sync_flush:
                    await self.inner.committer.wait_durable(self.log.commit_log.write_offset)
                self.confirm()
            await data.wait()

    def _refuse(self, what: str) -> NotMaster:
        if self.role != "master":
            return NotMaster(f"broker {self.me} is not the master of {self.settings.group}")
        if self.fenced_version:
            return NotMaster(f"broker {self.me}: switchover in progress, {what} refused")
        if not self.standing.valid(self.now_ms()):
            return NotMaster(f"broker {self.me} lost its standing as master; {what} refused")
        return NotMaster(
            f"group {self.settings.group}: fewer than {self.min_in_sync} in-sync replicas; "
            f"{what} refused"
        )

    def _master_only(self, what: str) -> None:
        if not self.accepting():
            raise self._refuse(what)

    # -- StorePort --------------------------------------------------------------------------

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
        return max(0, self.log.commit_log.write_offset - self.confirmed)

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
        return ReadResult(status, kept, start + len(kept), result.min_offset, start + len(kept))

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

    # -- serving slaves ---------------------------------------------------------------------

    def serve_epochs(self, head: dict[str, Any]) -> Replicated:
        if self.role != "master" or head.get("epoch") != self.role_epoch:
            raise NotMaster(f"broker {self.me} is not master at epoch {head.get('epoch')}")
        answer = {"epochs": self.state.epochs, "end": self.log.commit_log.write_offset}
        return Replicated(answer, b"")

    async def serve_fetch(self, head: dict[str, Any]) -> Replicated:
        """A slave's fetch: its acknowledgement (``offset``, durable there) and the next chunk,
        held up to ``wait_ms`` when there is nothing new."""
        epoch, replica, offset = int(head["epoch"]), str(head["id"]), int(head["offset"])
        if self.role != "master" or epoch != self.role_epoch:
            raise NotMaster(f"broker {self.me} is not master at epoch {epoch}")
        end = self.log.commit_log.write_offset
        if offset > end:
            raise StoreError(f"replica {replica} at {offset} is past this log's end {end}")
        if head.get("grant") and not self.fenced_version:
            self.grants.grant(replica, int(head["echo_ms"]), self.settings.timing.master_timeout_ms)
        self._acknowledged(replica, offset, end)
        applied = int(head.get("registry_version", 0))
        if applied != self.registry_acks.get(replica):
            self.registry_acks[replica] = applied
            self._wake()
        if offset >= end:
            data = self._data
            with anyio.move_on_after(int(head.get("wait_ms", 0)) / 1000):
                await data.wait()
        chunk = read_chunk(self.log, offset, self.settings.fetch_bytes)
        answer: dict[str, Any] = {
            "epoch": self.role_epoch,
            # What a replica's promise counts from, and whether this master may still
            # confirm on one (a fenced one never will in this term).
            "sent_ms": self.now_ms(),
            "fenced": bool(self.fenced_version),
            "start": chunk.start,
            "end": chunk.end,
            "confirmed": self.confirmed,
            "epochs": self.state.epochs,
            "batches": [
                [batch_id, r.start_offset, r.end_offset, r.record_count]
                for batch_id, r in self.batches.items()
                if chunk.start <= r.start_offset and r.end_offset <= chunk.end
            ]
            if chunk.data
            else [],
        }
        if int(head.get("registry_version", 0)) != self.registry_version:
            answer["registry_version"] = self.registry_version
            # Not a snapshot: that would count as written, and the master's next append
            # would not save a registry its file may not hold yet.
            answer["registry"] = self.log.registry.document().decode()
        answer["offsets"], answer["fences"] = self._offsets_for(
            replica, bool(head.get("all_offsets"))
        )
        return Replicated(answer, chunk.data)

    def _acknowledged(self, replica: str, offset: int, end: int) -> None:
        advanced = offset > self.acks.get(replica, -1)
        if advanced:
            self.acks[replica] = offset
        if advanced or offset >= end:
            self.progress[replica] = self.now_ms()
        self.confirm()

    def _offsets_for(
        self, replica: str, everything: bool
    ) -> tuple[list[list[Any]], list[list[Any]]]:
        """The offsets and fencing tokens changed since ``replica``'s last fetch (all of
        them on its first)."""
        offsets, fences = self.log.offsets.offsets, self.log.offsets.fences
        dirty = self.dirty_offsets.get(replica)
        if everything or dirty is None:
            keys: Any = list(offsets) + [k for k in fences if k not in offsets]
        else:
            keys = dirty
        self.dirty_offsets[replica] = set()
        return (
            [[g, q, p, offsets[(g, q, p)]] for g, q, p in keys if (g, q, p) in offsets],
            [[g, q, p, fences[(g, q, p)]] for g, q, p in keys if (g, q, p) in fences],
        )
