"""A simulated broker: the replication contract at the level of (epoch, message) entries.

Durable across a crash: the log up to ``durable``, the highest epoch seen, the last epoch
it was master at, the boot count. Back from a crash it resigns from that epoch: its unflushed
tail is gone and slaves may hold entries it lost, so the same epoch must not go on.
A master appends, flushes after ``flush_ms`` (a crash loses what was not flushed) and
confirms an offset once it is flushed here and acknowledged by every replica that
``InSyncTracker`` says a confirm waits for, while its ``Standing`` holds, it is not fenced
and at least ``min_in_sync`` replicas count. It refuses appends when it cannot confirm. A
slave syncs with its master (epoch files, truncation at the common point), then pulls;
each pull acknowledges what it has. The role comes only from heartbeat answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controller.sim.messages import (
    Entry,
    HeartbeatCall,
    HeartbeatReply,
    PublishCall,
    PublishReply,
    PullCall,
    PullReply,
    ReadLogCall,
    ReadLogReply,
    SyncCall,
    SyncReply,
)
from controller.sim.world import Node, World
from meta.groups.contract import (
    ANYONE,
    Grants,
    InSyncTracker,
    Promise,
    Standing,
    common_point,
    stale,
)
from meta.groups.records import SEQ_BOOT_SHIFT, GroupRecord, LagReport, ReplicaReport, Role

if TYPE_CHECKING:
    from controller.sim.checks import Oracle

PULL_BATCH = 32
READ_BATCH = 32


@dataclass(frozen=True, slots=True)
class BrokerTiming:
    heartbeat_ms: int
    master_timeout_ms: int
    lag_timeout_ms: int
    min_in_sync: int
    flush_ms: int = 5
    pull_hold_ms: int = 250  # a pull with nothing to send waits this long for entries
    retry_ms: int = 400  # a sync or pull unanswered this long is sent again
    # Rule 14: standing from the in-sync replicas' promises (min_in_sync a majority).
    replica_standing: bool = False
    safety_margin_ms: int = 0


@dataclass(slots=True)
class Waiter:
    client: str
    inc: int
    request: int
    ids: tuple[int, ...]
    end: int  # confirmed once the confirm offset reaches this


class SimBroker(Node):
    def __init__(
        self, world: World, name: str, group: str, store: str, timing: BrokerTiming, oracle: Oracle
    ) -> None:
        super().__init__(world, name)
        self.group, self.store, self.timing, self.oracle = group, store, timing, oracle
        self.priority = world.rng.randrange(3)
        # Durable.
        self.log: list[Entry] = []
        self.durable = 0
        self.epoch_seen = 0
        self.master_epoch = 0
        self.boot = 0
        self.resigned_epoch = 0
        self._reset()

    def _reset(self) -> None:
        self.role: Role = "none"
        self.role_epoch = 0
        self.record: GroupRecord | None = None
        self.standing = Standing()
        self.grants = Grants()  # rule 14: the replicas' promises
        self.fenced_version = 0
        self.confirmed = 0
        self.beats = 0
        # As master.
        self.in_sync = InSyncTracker(self.name)
        self.acks: dict[str, int] = {}
        self.progress: dict[str, int] = {}  # local ms when a replica last kept up
        self.held: list[tuple[str, int, int]] = []  # pulls waiting: (slave, inc, start)
        self.waiters: list[Waiter] = []
        self.flushing = False
        # As slave.
        self.following: tuple[str, int] | None = None
        self.synced = False
        self.asked_at = 0  # local ms of the last sync or pull sent
        self.echo_ms = -1  # what the next pull promises on (-1: nothing)
        self.promise = Promise()

    # -- life --

    def on_start(self) -> None:
        self.boot += 1
        self.resigned_epoch = self.master_epoch
        self._reset()
        if self.timing.replica_standing:  # a promise made before the crash may still hold
            self._promise(ANYONE)
        self.index = {msg: offset for offset, (_, msg) in enumerate(self.log)}
        self._heartbeat()

    def on_crash(self) -> None:
        lost = self.world.rng.randint(self.durable, len(self.log))
        self.truncate(lost, "crash")
        self.durable = len(self.log)  # what survived the crash is on disk
        self.oracle.crashed(self)

    def can_confirm(self) -> bool:
        if not self.up or self.role != "master" or self.fenced_version:
            return False
        now = self.now()
        return self.standing.valid(now) or self._granted(now)

    def _granted(self, now: int) -> bool:
        if not self.timing.replica_standing:
            return False
        return self.grants.cover(self.in_sync.required(), self.timing.min_in_sync, now)

    def _promised_elsewhere(self, master: str) -> bool:
        return self.promise.binds(master, self.now())

    def _promise(self, master: str) -> None:
        timing = self.timing
        self.promise.make(master, self.now(), timing.master_timeout_ms, timing.safety_margin_ms)

    def epochs(self) -> tuple[tuple[int, int], ...]:
        found: list[tuple[int, int]] = []
        for offset, (epoch, _) in enumerate(self.log):
            if not found or found[-1][0] != epoch:
                found.append((epoch, offset))
        return tuple(found)

    def truncate(self, end: int, why: str) -> None:
        if end >= len(self.log):
            return
        self.world.note(f"{self.name} truncates {len(self.log)} -> {end} ({why})")
        self.oracle.truncating(self, end, why)
        for _, msg in self.log[end:]:
            self.index.pop(msg, None)
        del self.log[end:]
        self.durable = min(self.durable, end)
        self.confirmed = min(self.confirmed, end)

    # -- heartbeats: the only way a broker learns its role --

    def _heartbeat(self) -> None:
        self._beat()
        self.timer(self.timing.heartbeat_ms, self._heartbeat)
        if self.role == "slave" and self.now() - self.asked_at >= self.timing.retry_ms:
            self._ask_master()

    def _beat(self) -> None:
        self.beats += 1
        seq = self.boot << SEQ_BOOT_SHIFT | self.beats
        lag = self._review_replicas(seq) if self.role == "master" else None
        report = ReplicaReport(
            group=self.group,
            broker_id=self.name,
            seq=seq,
            epoch=self.epoch_seen,
            role=self.role,
            log_epoch=self.log[-1][0] if self.log else 0,
            end=len(self.log),
            confirmed=self.confirmed,
            priority=self.priority,
            fenced_version=self.fenced_version,
            resigned_epoch=self.resigned_epoch,
            address=self.name,
        )
        self.send(self.store, HeartbeatCall(self.incarnation, report, lag, self.now()))

    def _review_replicas(self, seq: int) -> LagReport:
        """Lagging replicas out (stored ones through the controller), caught-up ones in."""
        lagging = self.in_sync.review(
            self.acks, self.progress, len(self.log), self.confirmed, self.now(),
            self.timing.lag_timeout_ms, seq,
        )  # fmt: skip
        return LagReport(self.group, self.name, self.epoch_seen, lagging, self.in_sync.asked())

    def _on_answer(self, answer: HeartbeatReply) -> None:
        record = answer.record
        if record.epoch < self.epoch_seen or stale(record, self.record):
            return
        self.oracle.epoch_seen(self, self.epoch_seen, record.epoch)
        self.epoch_seen = record.epoch
        self.record = record
        before = (self.role, self.role_epoch, self.fenced_version)
        self._follow_record(record, answer)
        if (self.role, self.role_epoch, self.fenced_version) != before:
            self._beat()  # tell the controller at once (a switchover waits for it)

    def _follow_record(self, record: GroupRecord, answer: HeartbeatReply) -> None:
        if record.master == self.name and record.epoch > self.resigned_epoch:
            if self.role != "master" or self.role_epoch != record.epoch:
                if self._promised_elsewhere(self.name):
                    self.following, self.synced = None, False  # stop renewing the promise
                    return
                self._become_master(record)
            self.in_sync.on_record(record.in_sync, answer.seq)
            if record.fence:
                self.fenced_version = record.fence_version
                self.standing.revoke()
                self.grants.revoke()
            else:
                self.fenced_version = 0
                self.standing.grant(answer.sent_ms, self.timing.master_timeout_ms)
                self.oracle.standing(self)
            self._confirm()
            return
        if self.role == "master":
            self._reset_role()
        if record.master == self.name:
            return  # resigned from this epoch: wait for the next
        if record.master and self.following != (record.master, record.epoch):
            if self._promised_elsewhere(record.master):
                self.following, self.synced = None, False
                return
            self.world.note(f"{self.name} follows {record.master} at {record.epoch}")
            self.echo_ms = -1  # nothing promised to this one yet
            self.role, self.role_epoch = "slave", record.epoch
            self.following, self.synced = (record.master, record.epoch), False
            self._ask_master()

    def _become_master(self, record: GroupRecord) -> None:
        self._reset_role()
        self.world.note(f"{self.name} master at {record.epoch}, end {len(self.log)}")
        self.role, self.role_epoch = "master", record.epoch
        self.master_epoch = record.epoch  # persisted before acting as master
        self.in_sync = InSyncTracker(self.name, record.in_sync - {self.name}, len(self.log))
        # Members kept from the old set get one lag timeout to reach the new master.
        self.progress = dict.fromkeys(sorted(self.in_sync.stored), self.now())
        self.oracle.master(self, record.epoch)

    def _reset_role(self) -> None:
        self.role, self.following, self.synced = "none", None, False
        self.standing.revoke()
        self.grants.revoke()
        self.fenced_version = 0
        self.in_sync = InSyncTracker(self.name)
        self.acks, self.progress, self.held, self.waiters = {}, {}, [], []

    # -- as master --

    def _accepting(self) -> bool:
        return self.can_confirm() and 1 + len(self.in_sync.stored) >= self.timing.min_in_sync

    def _publish(self, src: str, call: PublishCall) -> None:
        if not self._accepting():
            self.send(src, PublishReply(call.request, ()), call.inc)
            return
        end = 0
        appended = False
        for msg in call.ids:
            offset = self.index.get(msg)
            if offset is None:
                offset = len(self.log)
                self.log.append((self.role_epoch, msg))
                self.index[msg] = offset
                appended = True
            end = max(end, offset + 1)
        self.waiters.append(Waiter(src, call.inc, call.request, call.ids, end))
        if appended:
            self._serve_held()
            if not self.flushing:
                self.flushing = True
                self.timer(self.timing.flush_ms, self._flush)
        self._confirm()

    def _flush(self) -> None:
        self.flushing = False
        self.durable = len(self.log)
        self._confirm()

    def _pull(self, src: str, call: PullCall) -> None:
        if self.role != "master" or call.epoch != self.role_epoch or call.start > len(self.log):
            return
        if call.echo_ms >= 0 and not self.fenced_version:
            self.grants.grant(src, call.echo_ms, self.timing.master_timeout_ms)
        advanced = call.start > self.acks.get(src, -1)
        if advanced:
            self.acks[src] = call.start
        if advanced or self.acks[src] >= len(self.log):
            self.progress[src] = self.now()
        if call.start < len(self.log):
            self._send_entries(src, call.inc, call.start)
        else:
            self.held.append((src, call.inc, call.start))
            self.timer(self.timing.pull_hold_ms, self._release, src, call.inc, call.start)
        self._confirm()

    def _send_entries(self, slave: str, inc: int, start: int) -> None:
        entries = tuple(self.log[start : start + PULL_BATCH])
        reply = PullReply(self.role_epoch, start, entries, self.confirmed, self.now(),
                          bool(self.fenced_version))  # fmt: skip
        self.send(slave, reply, inc)

    def _serve_held(self) -> None:
        held, self.held = self.held, []
        for slave, inc, start in held:
            self._send_entries(slave, inc, start)

    def _release(self, slave: str, inc: int, start: int) -> None:
        if (slave, inc, start) in self.held:
            self.held.remove((slave, inc, start))
            self._send_entries(slave, inc, start)

    def _confirm(self) -> None:
        if not self.can_confirm():
            return
        required = self.in_sync.required()
        if 1 + len(required) < self.timing.min_in_sync:
            return
        offset = self.durable
        for replica in required:
            offset = min(offset, self.acks.get(replica, 0))
        if offset > self.confirmed:
            self.confirmed = offset
            self.oracle.confirmed(self)
        done = [w for w in self.waiters if w.end <= self.confirmed]
        if done:
            self.waiters = [w for w in self.waiters if w.end > self.confirmed]
            for w in done:
                self.send(w.client, PublishReply(w.request, w.ids), w.inc)

    # -- as slave --

    def _ask_master(self) -> None:
        if self.following is None:
            return
        master, epoch = self.following
        self.asked_at = self.now()
        if self.synced:
            self.send(master, PullCall(self.incarnation, epoch, len(self.log), self.echo_ms))
        else:
            self.send(master, SyncCall(self.incarnation, epoch))

    def _synced(self, reply: SyncReply) -> None:
        if self.following is None or reply.epoch != self.following[1] or self.synced:
            return
        cut = common_point(self.epochs(), len(self.log), reply.epochs, reply.end)
        if cut < self.confirmed:  # rule 12: never cut a confirmed entry; say "diverged"
            self.world.note(f"{self.name} will not follow: it would cut confirmed entries")
            self.role = "diverged"
            self._beat()
            return
        self.truncate(cut, "rejoin")
        self.synced = True
        self._ask_master()

    def _pulled(self, reply: PullReply) -> None:
        if self.following is None or reply.epoch != self.following[1] or not self.synced:
            return
        if self.timing.replica_standing:  # the promise, made on receipt
            if reply.fenced:
                self.promise.release()
                self.echo_ms = -1
            else:
                self._promise(self.following[0])
                self.echo_ms = reply.sent_ms
        if reply.start != len(self.log):
            return  # a duplicate or an overtaken answer: the next pull asks again
        for entry in reply.entries:
            self.index[entry[1]] = len(self.log)
            self.log.append(entry)
        self.durable = len(self.log)  # written and fsynced before the next pull acks it
        confirmed = min(reply.confirmed, len(self.log))
        if confirmed > self.confirmed:
            self.confirmed = confirmed
            self.oracle.confirmed(self)
        self._ask_master()

    # -- dispatch --

    def receive(self, src: str, message: Any) -> None:
        match message:
            case HeartbeatReply():
                self._on_answer(message)
            case PullCall():
                self._pull(src, message)
            case PullReply():
                self._pulled(message)
            case SyncCall(inc, epoch):
                if self.role == "master" and epoch == self.role_epoch:
                    self.send(src, SyncReply(epoch, self.epochs(), len(self.log)), inc)
            case SyncReply():
                self._synced(message)
            case PublishCall():
                self._publish(src, message)
            case ReadLogCall(inc, start):
                entries = tuple(self.log[start : min(self.confirmed, start + READ_BATCH)])
                self.send(src, ReadLogReply(start, entries), inc)
