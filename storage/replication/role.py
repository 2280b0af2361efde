"""A replicated broker's role and confirm offset: the state ``ReplicatedStore`` is built on.

The role comes only from the controller's group record (storage/replication/member.py follows
it and calls ``become_master``, ``become_slave``, ``diverge``, ``step_down`` and
``follow_standing``); docs/controller.md, "The contract", is the rule book and
meta/groups/contract.py its pure helpers, which this module uses as the simulation's brokers
do. As master it confirms an offset once it is durable here and, in ``sync`` mode,
acknowledged by every replica ``InSyncTracker.required()`` names, while its standing holds and
it is not fenced; ``_refuse`` says why it cannot. The slaves' side (storage/replication/
serving.py) and the StorePort (storage/replication/replicated_store.py) build on this class.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any

import anyio

from meta.groups.contract import Grants, InSyncTracker, Standing
from meta.groups.records import GroupRecord, LagReport, Role
from storage.config import FlushPolicy
from storage.errors import NotMaster
from storage.log.embedded import EmbeddedStore
from storage.replication.confirm_windows import ConfirmWindows, wall_stamp
from storage.replication.settings import ReplicationMode, ReplicationSettings
from storage.replication.state import ReplicationState
from storage.results import AppendResult

log = logging.getLogger("mqgw.storage.replication")


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class ReplicaRole:
    """The role, standing and confirm offset of a replicated broker (see the module doc)."""

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
                # Confirming nothing until replicas join: the stretch ends at its last confirm
                # (left open, a checker took a master stalled so as still confirming).
                self.windows.closed("too few in sync")
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
