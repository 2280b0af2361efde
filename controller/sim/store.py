"""The simulation's Redis: the controller's keys and scripts as a Python model, and the node
that serves it over the simulated network.

``StoreModel`` mirrors ``controller/scripts.py`` check for check; tests/controller/
test_scripts_contract.py runs the same calls through both and compares the answers. Redis
is the reference clock (the simulation's global time): leases expire by it and heartbeats
are stamped with it. A store restart keeps the data (AOF, fsync always) and changes the
run id; while it is down, what is sent to it is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from controller.actions import (
    BAD_FENCE,
    NOT_ASKED,
    NOT_IN_SYNC,
    NOT_LEADER,
    NOT_SILENT,
    STALE,
    Elect,
    MarkDown,
    ResumeConfirming,
    SetInSync,
    StopConfirming,
    Write,
    WriteResult,
)
from controller.events import GroupRead, LeaseAcquired, LeaseLost
from controller.sim.messages import (
    HeartbeatCall,
    HeartbeatReply,
    HoldCall,
    ReadCall,
    ReadReply,
    RecordCall,
    WriteCall,
    WriteReply,
)
from controller.sim.world import Node, World
from controller.snapshot import Snapshot
from meta.groups.records import GroupRecord, LagReport, ReplicaReport


@dataclass(slots=True)
class Lease:
    holder: str
    token: int
    expires_ms: int


@dataclass(slots=True)
class StoreModel:
    lease: Lease | None = None
    tokens: int = 0
    records: dict[str, GroupRecord] = field(default_factory=dict)
    replicas: dict[tuple[str, str], tuple[ReplicaReport, LagReport | None]] = field(
        default_factory=dict
    )
    switchovers: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    feed: list[dict[str, str]] = field(default_factory=list)
    last_write: tuple[Write, GroupRecord] | None = None

    # -- the leader lease --

    def hold(self, holder: str, ttl_ms: int, now_ms: int) -> LeaseAcquired | LeaseLost:
        """Take or extend the lease (``RedisApply.hold``'s answer); lost if another holds it."""
        lease = self._lease(now_ms)
        if lease is not None and lease.holder != holder:
            return LeaseLost(lease.holder)
        if lease is None:
            self.tokens += 1
            lease = self.lease = Lease(holder, self.tokens, 0)
        lease.expires_ms = now_ms + ttl_ms
        return LeaseAcquired(lease.token, lease.expires_ms)

    def drop(self, holder: str, now_ms: int) -> None:
        lease = self._lease(now_ms)
        if lease is not None and lease.holder == holder:
            self.lease = None

    def _lease(self, now_ms: int) -> Lease | None:
        if self.lease is not None and now_ms >= self.lease.expires_ms:
            self.lease = None
        return self.lease

    def _leads(self, holder: str, token: int, now_ms: int) -> bool:
        lease = self._lease(now_ms)
        return lease is not None and lease.holder == holder and lease.token == token

    # -- brokers --

    def heartbeat(self, report: ReplicaReport, lag: LagReport | None, now_ms: int) -> GroupRecord:
        key = (report.group, report.broker_id)
        stored = self.replicas.get(key)
        if stored is None or report.seq > stored[0].seq:
            self.replicas[key] = (replace(report, at_ms=now_ms), _stored_lag(report, lag))
        return self.record(report.group)

    def record(self, group: str) -> GroupRecord:
        return self.records.get(group) or GroupRecord(group)

    def request_switchover(self, group: str, request_id: str, target: str, now_ms: int) -> None:
        self.switchovers[group] = (request_id, target, now_ms + 30_000)

    # -- the controller --

    def snapshot(self, now_ms: int, run_id: str) -> Snapshot:
        lease = self._lease(now_ms)
        groups = sorted({g for g, _ in self.replicas} | set(self.records))
        live = {g: v for g, v in self.switchovers.items() if v[2] > now_ms}
        return Snapshot(
            now_ms=now_ms,
            run_id=run_id,
            lease_holder="" if lease is None else f"{lease.holder} {lease.token}",
            records=tuple(self.record(g) for g in groups),
            replicas=tuple(self.replicas[k] for k in sorted(self.replicas)),
            switchovers=tuple((g, v[0], v[1]) for g, v in sorted(live.items())),
        )

    def write(
        self, holder: str, token: int, action: Write, silence_ms: int, now_ms: int
    ) -> WriteResult:
        if not self._leads(holder, token, now_ms):
            return WriteResult(False, NOT_LEADER, None)
        record = self.record(action.group)
        if record.version != action.expect_version:
            return WriteResult(False, STALE, None)
        refused = self._check(record, action, silence_ms, now_ms)
        if refused:
            return WriteResult(False, refused, None)
        written = self._written(record, action, token, now_ms)
        self.last_write = (action, written)
        self.records[action.group] = written
        if not isinstance(action, MarkDown):
            self.feed.append({"kind": _KINDS[type(action)], "group": action.group})
        return WriteResult(True, "", written)

    def _check(self, record: GroupRecord, action: Write, silence_ms: int, now_ms: int) -> str:
        master = self.replicas.get((record.group, record.master))
        report, lag = master if master is not None else (None, None)
        last_ms = report.at_ms if report is not None else 0
        old_master = isinstance(action, Elect) and record.master
        if old_master and not _stopped(record, report) and now_ms - last_ms < silence_ms:
            return NOT_SILENT
        match action:
            case Elect() if record.master and not action.unclean:
                if action.master not in record.in_sync:
                    return NOT_IN_SYNC
            case SetInSync():
                if action.epoch != record.epoch or record.master not in action.in_sync:
                    return STALE
                if action.added and (lag is None or lag.epoch != record.epoch):
                    return NOT_ASKED
                if lag is not None and not action.added <= lag.caught_up:
                    return NOT_ASKED
            case StopConfirming():
                if action.epoch != record.epoch or record.fence:
                    return BAD_FENCE
                outside = action.target not in record.in_sync and not action.rescue
                if outside or action.target == record.master:
                    return NOT_IN_SYNC
            case ResumeConfirming():
                if action.epoch != record.epoch or not record.fence:
                    return BAD_FENCE
        return ""

    def _written(self, record: GroupRecord, action: Write, token: int, now_ms: int) -> GroupRecord:
        written = replace(record, version=record.version + 1, token=token, changed_ms=now_ms)
        match action:
            case Elect():
                epoch = max(record.epoch + 1, action.min_epoch)
                return replace(
                    written,
                    epoch=epoch,
                    master=action.master,
                    in_sync=action.in_sync,
                    fence="",
                    fence_version=0,
                )
            case SetInSync():
                return replace(written, in_sync=action.in_sync)
            case StopConfirming():
                self.switchovers.pop(action.group, None)
                return replace(written, fence=action.target, fence_version=written.version)
            case ResumeConfirming():
                return replace(written, fence="", fence_version=0)
            case MarkDown():
                return replace(written, down=action.down, version=written.version + action.jump)
        raise AssertionError(action)


def _stored_lag(report: ReplicaReport, lag: LagReport | None) -> LagReport | None:
    """What Redis keeps (model.parse_heartbeat): a master's requests, empty if none."""
    if report.role != "master":
        return None
    if lag is None:
        return LagReport(report.group, report.broker_id, report.epoch)
    return replace(lag, epoch=report.epoch)


def _show(item: object) -> str:
    """A dataclass for the trace, sets sorted (their order differs between processes)."""
    fields = getattr(item, "__dataclass_fields__", {})
    shown = []
    for name in fields:
        value = getattr(item, name)
        shown.append(f"{name}={sorted(value) if isinstance(value, frozenset) else value!r}")
    return f"{type(item).__name__}({', '.join(shown)})"


def _stopped(record: GroupRecord, report: ReplicaReport | None) -> bool:
    """The master's stored heartbeat says it cannot be confirming at the record's epoch:
    fenced by the current switchover, or resigned after a restart."""
    if report is None:
        return False
    if report.resigned_epoch >= record.epoch:
        return True
    return (
        bool(record.fence)
        and report.epoch == record.epoch
        and (report.fenced_version == record.fence_version)
    )


_KINDS: dict[type, str] = {
    Elect: "group.master",
    SetInSync: "group.in_sync",
    StopConfirming: "group.fence",
    ResumeConfirming: "group.fence",
}


class SimStore(Node):
    """Redis on the simulated network."""

    def __init__(
        self,
        world: World,
        name: str,
        silence_ms: int,
        lease_ms: int,
        on_write: Callable[[GroupRecord], None],
    ) -> None:
        super().__init__(world, name)
        self.model = StoreModel()
        self.silence_ms = silence_ms
        self.lease_ms = lease_ms
        self.on_write = on_write
        self.run_id = ""

    def on_start(self) -> None:
        self.run_id = f"run-{self.incarnation}"

    def receive(self, src: str, message: Any) -> None:
        now, model = self.world.now, self.model
        match message:
            case HeartbeatCall(inc, report, lag, sent_ms):
                record = model.heartbeat(report, lag, now)
                self.send(src, HeartbeatReply(record, sent_ms, report.seq), inc)
            case ReadCall(inc):
                self.send(src, ReadReply(model.snapshot(now, self.run_id)), inc)
            case HoldCall(inc, holder):
                self.send(src, model.hold(holder, self.lease_ms, now), inc)
            case WriteCall(inc, holder, action):
                token = int(holder.rpartition(" ")[2])
                name = holder.rpartition(" ")[0]
                result = model.write(name, token, action, self.silence_ms, now)
                if result.record is not None:
                    self.world.note(f"store: {_show(action)} -> {_show(result.record)}")
                    self.on_write(result.record)
                self.send(src, WriteReply(action, result), inc)
            case RecordCall(inc, group):
                self.send(src, GroupRead(model.record(group)), inc)
