"""The controller's decision step: ``step(state, event) -> actions``, with no I/O and no clock.

Theory of operation. Observations (``GroupRead``, ``Heartbeat``, ``LagReported``,
``Registration``, ``SwitchoverRequested``, lease results) only update ``ControllerState``;
``Tick(now)`` decides. A controller decides only while it holds the leader lease (by its own
reading of Redis time), and then at most one record write per group per tick, because every
write is checked against the record version it was decided on: two writes decided on the same
version could not both land. In order of precedence, per group:

1. first master: a group with no master elects its best alive broker once every broker had
   ``bootstrap_wait_ms`` to report;
2. failover: the master silent for ``election_silence_ms`` (it stopped confirming
   ``safety_margin_ms`` earlier, by its own clock), or back from a restart (it reports
   itself resigned from its epoch), is replaced by the best alive member of the in-sync set,
   ranked by (log epoch, end offset, priority); the new in-sync set is the new master and
   the live members of the old one, and the script re-checks silence or resignation
   atomically;
3. switchover: a fenced master (``StopConfirming`` acknowledged) hands over to its target
   once the target has everything; a switchover past its deadline is called off;
4. in-sync changes, fenced by the epoch: out go replicas the master reports lagging and
   slaves silent for ``broker_timeout_ms``; in come replicas the master reports caught up;
5. the down set, for operators.
``Demote`` and ``Stuck`` are notices that do not write the record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.actions import (
    Action,
    Demote,
    Elect,
    HoldLease,
    MarkDown,
    ResumeConfirming,
    SetInSync,
    StopConfirming,
    Stuck,
)
from controller.events import (
    Event,
    GroupRead,
    Heartbeat,
    LagReported,
    LeaseAcquired,
    LeaseLost,
    Registration,
    StoreRestarted,
    SwitchoverRequested,
    Tick,
)
from meta.groups.records import GroupRecord, LagReport, ReplicaReport
from meta.groups.timing import ControllerConfig


@dataclass(slots=True)
class BrokerView:
    broker_id: str
    report: ReplicaReport | None = None  # None: registered only (no heartbeat record)
    registered_alive: bool | None = None  # None: not in the registry


@dataclass(slots=True)
class GroupView:
    record: GroupRecord
    brokers: dict[str, BrokerView] = field(default_factory=dict)
    # Per broker: an old master's stored heartbeat still carries its last requests.
    lags: dict[str, LagReport] = field(default_factory=dict)
    first_seen_ms: int = 0  # when a heartbeat of this group was first seen (0: not yet)
    switchover: SwitchoverRequested | None = None
    handled_requests: set[str] = field(default_factory=set)
    stuck: str = ""  # the last Stuck reason given, so it is given once
    demoted: set[tuple[str, int]] = field(default_factory=set)
    # Redis restarted: the stored version may be below the one brokers follow (lost writes);
    # one write leaps past it (MarkDown with ``jump``) so their answers count again.
    touch: bool = False


VERSION_JUMP = 1_000_000  # far more writes than Redis can lose in one failover


@dataclass(slots=True)
class Leadership:
    token: int
    expires_ms: int


@dataclass(slots=True)
class ControllerState:
    config: ControllerConfig
    now_ms: int = 0
    leader: Leadership | None = None
    hold_until_ms: int = 0  # no failover before this (Redis restarted)
    groups: dict[str, GroupView] = field(default_factory=dict)

    def group(self, name: str) -> GroupView:
        view = self.groups.get(name)
        if view is None:
            view = self.groups[name] = GroupView(GroupRecord(name))
        return view


def step(state: ControllerState, event: Event) -> list[Action]:
    """Take ``event`` into ``state`` (the only place it changes); on a tick, decide."""
    match event:
        case Tick(now_ms):
            state.now_ms = now_ms
            return _tick(state)
        case LeaseAcquired(token, expires_ms):
            state.leader = Leadership(token, expires_ms)
        case LeaseLost():
            state.leader = None
        case StoreRestarted(now_ms):
            state.hold_until_ms = now_ms + state.config.election_silence_ms
            for view in state.groups.values():  # Redis may have lost writes: believe it again
                view.record = GroupRecord(view.record.group)
                view.touch = True
        case GroupRead(record):
            view = state.group(record.group)
            if (record.epoch, record.version) < (view.record.epoch, view.record.version):
                return []  # a write's answer overtaken by a later read
            if record.epoch != view.record.epoch:
                view.stuck = ""
            view.record = record
        case Heartbeat(report):
            view = state.group(report.group)
            _broker(view, report.broker_id).report = report
        case LagReported(lag):
            state.group(lag.group).lags[lag.broker_id] = lag
        case Registration(group, broker_id, alive):
            _broker(state.group(group), broker_id).registered_alive = alive
        case SwitchoverRequested(group, request_id):
            view = state.group(group)
            if request_id not in view.handled_requests:
                view.switchover = event
    return []


def _broker(view: GroupView, broker_id: str) -> BrokerView:
    found = view.brokers.get(broker_id)
    if found is None:
        found = view.brokers[broker_id] = BrokerView(broker_id)
    return found


def _tick(state: ControllerState) -> list[Action]:
    leader, now, config = state.leader, state.now_ms, state.config
    if leader is None or now >= leader.expires_ms:
        state.leader = None
        return [HoldLease(0)]
    actions: list[Action] = []
    if leader.expires_ms - now <= config.lease_ms // 2:
        actions.append(HoldLease(leader.token))
    for name in sorted(state.groups):
        actions += _decide_group(state, state.groups[name])
    return actions


def alive(broker: BrokerView, now_ms: int, config: ControllerConfig) -> bool:
    if broker.report is not None:
        return now_ms - broker.report.at_ms <= config.broker_timeout_ms
    return bool(broker.registered_alive)


def _decide_group(state: ControllerState, view: GroupView) -> list[Action]:
    now, config, record = state.now_ms, state.config, view.record
    live = {b.broker_id for b in view.brokers.values() if alive(b, now, config)}
    reporting = [b.report for b in view.brokers.values() if b.report is not None]
    if reporting and not view.first_seen_ms:
        view.first_seen_ms = now
    notices = _demotions(view, live)
    decided = (
        _first_master(state, view, live)
        if not record.master
        else _diverged(state, view, live)
        or _failover(state, view, live)
        or _switchover(state, view, live)
        or _in_sync(view, live)
    )
    if isinstance(decided, Stuck):  # a notice, given once per reason; the down set still goes
        if decided.reason != view.stuck:
            notices.append(decided)
        view.stuck, decided = decided.reason, None
    elif decided is not None:
        view.stuck = ""
    if decided is None:
        down = frozenset(view.brokers) - live
        if view.touch and record.version:
            view.touch = False
            decided = MarkDown(record.group, record.version, down, jump=VERSION_JUMP)
        elif down != record.down:
            decided = MarkDown(record.group, record.version, down)
    return notices if decided is None else [*notices, decided]


def _best(view: GroupView, candidates: set[str]) -> ReplicaReport | None:
    reports = [b.report for b in view.brokers.values() if b.broker_id in candidates and b.report]
    return min(reports, key=ReplicaReport.rank) if reports else None


def _min_epoch(view: GroupView) -> int:
    """Above every epoch anyone has seen, even if Redis lost the record's last writes."""
    seen = [b.report.epoch for b in view.brokers.values() if b.report is not None]
    return max([view.record.epoch, *seen]) + 1


def _kept_in_sync(record: GroupRecord, new_master: str, live: set[str]) -> frozenset[str]:
    """The new master's in-sync set: itself and the live members of the old set, which hold
    every confirmed entry (the new master waits for their acknowledgements from its first
    confirm, and reports the ones that do not come). The old master leaves it: it is dead,
    restarted or handing over, and rejoins like any slave."""
    kept = (record.in_sync & live) - {record.master}
    return frozenset(kept | {new_master})


def _first_master(state: ControllerState, view: GroupView, live: set[str]) -> Action | None:
    now = state.now_ms
    reporting = {b for b in live if view.brokers[b].report is not None}
    if not reporting:
        return None
    if now - view.first_seen_ms < state.config.bootstrap_wait_ms or now < state.hold_until_ms:
        return None
    best = _best(view, reporting)
    assert best is not None
    return _elect_alone(view, best.broker_id, "first master of the group")


def _diverged(state: ControllerState, view: GroupView, live: set[str]) -> Action | None:
    """A live broker that saw the record's epoch will not follow its master: the master lacks
    entries confirmed before (it was elected from a record Redis had lost writes of: a
    Sentinel failover to a replica that missed the in-sync set's last shrink, say). Once the
    master cannot be confirming (silent for the election silence, or resigned), elect at a
    new epoch the live broker holding the most confirmed entries, alone in sync (others join
    as slaves do); it may be outside the stored in-sync set, which is the stale part. While
    the master is alive it is first told to stop confirming (a rescue fence, as for a
    switchover), then the holder is elected: both confirming at once must not happen."""
    record = view.record
    reports = [b.report for b in view.brokers.values() if b.broker_id in live and b.report]
    refusing = [r for r in reports if r.role == "diverged" and r.epoch >= record.epoch]
    # Brokers past the record's epoch: Redis lost an election (a failover to a replica
    # without it); they will never follow the record's master at its older epoch, so with
    # too few followers nothing is confirmed until an election passes theirs (nemesis seed
    # 122: 159 s without a confirm, for good had that master not been killed).
    # (A master gone silent is replaced by the failover, above every epoch reported.)
    ahead = _past_record(view, live) if record.master in live else []
    if not refusing and not ahead:
        return None
    confirmed = max(r.confirmed for r in (refusing or reports))
    holders = {r.broker_id for r in reports if r.confirmed >= confirmed} - {record.master}
    best = _best(view, holders)
    if best is None:  # the record's master alone holds the most: a rescue would lose some
        if refusing:  # (the refusing broker itself always qualifies; kept for the types)
            return None
        behind = ", ".join(sorted(r.broker_id for r in ahead))
        return Stuck(
            record.group,
            f"the record is at epoch {record.epoch}, behind {behind}; its master "
            f"{record.master} alone holds entries confirmed up to {confirmed}",
        )
    refusers = ", ".join(sorted(r.broker_id for r in refusing or ahead))
    master = view.brokers.get(record.master)
    report = master.report if master is not None else None
    silence = state.now_ms - (report.at_ms if report is not None else 0)
    resigned = report is not None and report.resigned_epoch >= record.epoch
    fenced = (
        report is not None
        and record.fence == best.broker_id
        and report.epoch == record.epoch
        and report.fenced_version == record.fence_version
    )
    if silence < state.config.election_silence_ms and not resigned and not fenced:
        if record.fence:  # asked: it stops at its next heartbeat answer
            return Stuck(record.group, f"rescue: waiting for {record.master} to stop")
        return StopConfirming(record.group, record.epoch, record.version, best.broker_id,
                              "rescue", rescue=True)  # fmt: skip
    why = (
        f"master {record.master} lacks entries confirmed up to {confirmed} "
        f"({refusers} will not follow it)"
        if refusing
        else f"the record went back to epoch {record.epoch}, behind {refusers} "
        f"(Redis lost an election)"
    )
    return _elect_alone(
        view, best.broker_id, why, unclean=best.broker_id not in record.in_sync
    )  # (unclean: the stored in-sync set is the stale part)


def _past_record(view: GroupView, live: set[str]) -> list[ReplicaReport]:
    """The live brokers other than the record's master that report an epoch above the
    record's: Redis lost the election that made it (a failover to a replica without it)."""
    record = view.record
    return [
        b.report
        for b in view.brokers.values()
        if b.broker_id in live
        and b.broker_id != record.master
        and b.report is not None
        and b.report.epoch > record.epoch
    ]


def _elect_alone(view: GroupView, master: str, reason: str, unclean: bool = False) -> Elect:
    """``master`` elected at a new epoch, alone in the in-sync set (the others join it as
    slaves do), replacing the record's master if there is one."""
    record = view.record
    return Elect(
        record.group,
        master,
        _min_epoch(view),
        frozenset((master,)),
        record.epoch,
        record.version,
        previous=record.master,
        reason=reason,
        unclean=unclean,
    )


def _failover(state: ControllerState, view: GroupView, live: set[str]) -> Action | None:
    record, now, config = view.record, state.now_ms, state.config
    master = view.brokers.get(record.master)
    report = master.report if master is not None else None
    silence = now - (report.at_ms if report is not None else 0)
    # A master that restarted says so (resigned) and cannot be confirming: no need to wait.
    resigned = report is not None and report.resigned_epoch >= record.epoch
    if silence < config.election_silence_ms and not resigned:
        return None
    if now < state.hold_until_ms and not resigned:
        return Stuck(record.group, "Redis restarted: waiting out the election silence")
    pool = set(view.brokers) if config.unclean_election else set(record.in_sync)
    # A resigned master may be elected again, at a new epoch (it may be the only one).
    best = _best(view, pool & live if resigned else (pool & live) - {record.master})
    ahead = _past_record(view, live) if best is None else []
    if ahead:
        # The stored in-sync set is stale: Redis lost the election of a newer term, whose
        # brokers hold what it confirmed (nemesis seed 123: stuck for good).
        ids = {r.broker_id for r in ahead}
        chosen = _best(view, ids)
        assert chosen is not None
        return _elect_alone(
            view,
            chosen.broker_id,
            f"master {record.master} silent for {silence} ms; the record went back to epoch "
            f"{record.epoch}, behind {', '.join(sorted(ids))} (Redis lost an election)",
            unclean=True,
        )
    if best is None:
        return Stuck(
            record.group,
            f"master {record.master} is silent and no in-sync replica is alive "
            f"(in sync: {sorted(record.in_sync)})",
        )
    unclean = best.broker_id not in record.in_sync
    why = (
        f"master {record.master} restarted"
        if resigned
        else (f"master {record.master} silent for {silence} ms")
    )
    return Elect(
        record.group,
        best.broker_id,
        _min_epoch(view),
        _kept_in_sync(record, best.broker_id, live),
        record.epoch,
        record.version,
        previous=record.master,
        reason=why + (" (unclean: not in sync)" if unclean else ""),
        unclean=unclean,
    )


def _switchover(state: ControllerState, view: GroupView, live: set[str]) -> Action | None:
    record, now, config = view.record, state.now_ms, state.config
    master = view.brokers[record.master].report if record.master in view.brokers else None
    if record.fence:
        target = view.brokers.get(record.fence)
        handed = (
            master is not None
            and master.epoch == record.epoch
            and master.fenced_version == record.fence_version
            and target is not None
            and target.report is not None
            and record.fence in live
            and record.fence in record.in_sync
            and target.report.end >= master.end
        )
        if handed:
            return Elect(
                record.group,
                record.fence,
                _min_epoch(view),
                _kept_in_sync(record, record.fence, live),
                record.epoch,
                record.version,
                previous=record.master,
                reason=f"switchover from {record.master}",
            )
        if now - record.changed_ms >= config.switchover_timeout_ms:
            return ResumeConfirming(
                record.group, record.epoch, record.version, "switchover timed out"
            )
        return None
    request = view.switchover
    if request is None or record.master not in live:
        return None
    view.switchover = None
    view.handled_requests.add(request.request_id)
    candidates = (set(record.in_sync) & live) - {record.master}
    if request.target:
        candidates &= {request.target}
    best = _best(view, candidates)
    if best is None:
        wanted = request.target or "any in-sync replica"
        return Stuck(record.group, f"switchover refused: {wanted} is not alive and in sync")
    return StopConfirming(
        record.group, record.epoch, record.version, best.broker_id, request.request_id
    )


def _in_sync(view: GroupView, live: set[str]) -> Action | None:
    record = view.record
    if record.master not in live:
        return None
    lag = view.lags.get(record.master)
    current = lag is not None and lag.epoch == record.epoch
    lagging = lag.lagging if current and lag is not None else frozenset()
    caught_up = lag.caught_up if current and lag is not None else frozenset()
    slaves = record.in_sync - {record.master}
    out = (slaves - live) | (slaves & lagging)
    added = frozenset((caught_up & live) - record.in_sync)
    changed = (record.in_sync - out) | added
    if changed == record.in_sync:
        return None
    reasons = []
    if out:
        reasons.append(f"out: {', '.join(sorted(out))} (lagging or down)")
    if added:
        reasons.append(f"in: {', '.join(sorted(added))} (caught up)")
    return SetInSync(record.group, record.epoch, record.version, changed, added, "; ".join(reasons))


def _demotions(view: GroupView, live: set[str]) -> list[Action]:
    record = view.record
    found: list[Action] = []
    for broker in view.brokers.values():
        report = broker.report
        if report is None or report.role != "master" or broker.broker_id not in live:
            continue
        stale = report.epoch < record.epoch or broker.broker_id != record.master
        key = (broker.broker_id, report.epoch)
        if stale and key not in view.demoted:
            view.demoted.add(key)
            found.append(Demote(record.group, broker.broker_id, report.epoch, record.epoch))
    return found
