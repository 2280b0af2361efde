"""The decision step as tables: a state (record, heartbeats, time) and a tick -> actions."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

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
from controller.decide import VERSION_JUMP, ControllerState, step
from controller.events import (
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

CONFIG = ControllerConfig()  # silence 2000 ms, broker timeout 1500 ms, lease 2000 ms
NOW = 100_000
S = frozenset


SLAVE = ReplicaReport("g", "", seq=1, epoch=3, role="slave", log_epoch=3, end=10, confirmed=10)
RECORD = GroupRecord("g", epoch=3, master="a", in_sync=S("ab"), version=7)


def rep(broker: str, at: int = NOW, **kw: Any) -> ReplicaReport:
    return replace(SLAVE, broker_id=broker, at_ms=at, **kw)


def rec(**kw: Any) -> GroupRecord:
    return replace(RECORD, **kw)


@dataclass
class Case:
    name: str
    record: GroupRecord
    reports: list[ReplicaReport]
    expect: list[Action]
    lags: list[LagReport] = field(default_factory=list)
    extra: list[object] = field(default_factory=list)  # more events, first
    config: ControllerConfig = CONFIG
    first_seen: int = NOW - 10_000


def decide(case: Case) -> list[Action]:
    state = ControllerState(case.config)
    step(state, LeaseAcquired(token=5, expires_ms=NOW + 1900))
    for event in case.extra:  # as Observer.events orders them: before the reads
        step(state, event)  # type: ignore[arg-type]
    step(state, GroupRead(case.record))
    for report in case.reports:
        step(state, Heartbeat(report))
    for lag in case.lags:
        step(state, LagReported(lag))
    state.group("g").first_seen_ms = case.first_seen
    return step(state, Tick(NOW))


def elect(master: str, reason: str, *, in_sync: str = "", epoch: int = 4, **kw: object) -> Elect:
    members = S(in_sync or master)
    return Elect("g", master, epoch, members, 3, 7, "a", reason, **kw)  # type: ignore[arg-type]


MASTER_A = rep("a", role="master")
CASES = [
    Case("all well: nothing", rec(), [MASTER_A, rep("b")], []),
    Case(
        "master silent 1999 ms: not yet",
        rec(), [rep("a", NOW - 1999, role="master"), rep("b")],
        [MarkDown("g", 7, S("a"))],
    ),
    Case(
        "master silent 2000 ms: best in-sync replica elected",
        rec(in_sync=S("abc")),
        [rep("a", NOW - 2000, role="master"), rep("b", end=9), rep("c", end=10)],
        [elect("c", "master a silent for 2000 ms", in_sync="bc")],
    ),
    Case(
        "the new in-sync set keeps the live members only",
        rec(in_sync=S("abc")),
        [rep("a", NOW - 2000, role="master"), rep("b", NOW - 1501), rep("c")],
        [elect("c", "master a silent for 2000 ms")],
    ),
    Case(
        "rank: log epoch before end offset",
        rec(in_sync=S("abc")),
        [rep("a", NOW - 5000), rep("b", log_epoch=3, end=9), rep("c", log_epoch=2, end=50)],
        [elect("b", "master a silent for 5000 ms", in_sync="bc")],
    ),
    Case(
        "rank: priority (lower first) breaks ties, then id",
        rec(in_sync=S("abcd")),
        [rep("a", NOW - 5000), rep("b", priority=2), rep("c", priority=1), rep("d", priority=1)],
        [elect("c", "master a silent for 5000 ms", in_sync="bcd")],
    ),
    Case(
        "only in-sync replicas: an up-to-date outsider is not elected",
        rec(in_sync=S("ab")),
        [rep("a", NOW - 5000), rep("b", NOW - 1600), rep("c", end=99)],
        [
            Stuck("g", "master a is silent and no in-sync replica is alive (in sync: ['a', 'b'])"),
            MarkDown("g", 7, S("ab")),
        ],
    ),
    Case(
        "stuck, and the down set still written",
        rec(in_sync=S("a")),
        [rep("a", NOW - 5000), rep("b")],
        [Stuck("g", "master a is silent and no in-sync replica is alive (in sync: ['a'])"),
         MarkDown("g", 7, S("a"))],
    ),
    Case(
        "unclean election when configured",
        rec(in_sync=S("ab")),
        [rep("a", NOW - 5000), rep("b", NOW - 1600), rep("c", end=99)],
        [elect("c", "master a silent for 5000 ms (unclean: not in sync)", unclean=True)],
        config=ControllerConfig(unclean_election=True),
    ),
    Case(
        "the new epoch is above every epoch any broker reported",
        rec(),
        [rep("a", NOW - 5000), rep("b", epoch=9)],
        [elect("b", "master a silent for 5000 ms", epoch=10)],
    ),
    Case(
        "a restarted master resigned: re-elected at once, itself if it is the best",
        rec(in_sync=S("a")),
        [rep("a", role="none", resigned_epoch=3), rep("b", end=50)],
        [elect("a", "master a restarted")],
    ),
    Case(
        "after a Redis restart: no failover for one election silence",
        rec(),
        [rep("a", NOW - 5000), rep("b")],
        [Stuck("g", "Redis restarted: waiting out the election silence"), MarkDown("g", 7, S("a"))],
        extra=[StoreRestarted(NOW - 1000)],
    ),
    Case(
        "first master: waits for every broker to report",
        rec(epoch=0, master="", in_sync=S(), version=0),
        [rep("a", epoch=0), rep("b", epoch=0)],
        [],
        first_seen=NOW - 1999,
    ),
    Case(
        "first master: then the most complete broker",
        rec(epoch=0, master="", in_sync=S(), version=0),
        [rep("a", epoch=0, end=5), rep("b", epoch=0, end=6)],
        [Elect("g", "b", 1, S("b"), 0, 0, "", "first master of the group")],
        first_seen=NOW - 2000,
    ),
    Case(
        "lagging slave out, fenced by the epoch",
        rec(in_sync=S("abc")),
        [MASTER_A, rep("b"), rep("c")],
        [SetInSync("g", 3, 7, S("ab"), S(), "out: c (lagging or down)")],
        lags=[LagReport("g", "a", 3, lagging=S("c"))],
    ),
    Case(
        "silent slave out even if the master does not say",
        rec(in_sync=S("ab")),
        [MASTER_A, rep("b", NOW - 1501)],
        [SetInSync("g", 3, 7, S("a"), S(), "out: b (lagging or down)")],
    ),
    Case(
        "caught-up slave in",
        rec(in_sync=S("a")),
        [MASTER_A, rep("b")],
        [SetInSync("g", 3, 7, S("ab"), S("b"), "in: b (caught up)")],
        lags=[LagReport("g", "a", 3, caught_up=S("b"))],
    ),
    Case(
        "requests of an old master's stored heartbeat are ignored",
        rec(in_sync=S("a")),
        [MASTER_A, rep("b"), rep("c", role="master", epoch=2)],
        [Demote("g", "c", 2, 3)],
        lags=[LagReport("g", "a", 3), LagReport("g", "c", 2, caught_up=S("b"))],
    ),
    Case(
        "a request from an earlier epoch of the master is ignored",
        rec(in_sync=S("a")),
        [MASTER_A, rep("b")],
        [],
        lags=[LagReport("g", "a", 2, caught_up=S("b"))],
    ),
    Case(
        "switchover: the master stops confirming first",
        rec(in_sync=S("abc")),
        [MASTER_A, rep("b", end=8), rep("c", end=10)],
        [StopConfirming("g", 3, 7, "c", "r1")],
        extra=[SwitchoverRequested("g", "r1", "")],
    ),
    Case(
        "switchover: to a named target only",
        rec(in_sync=S("ab")),
        [MASTER_A, rep("b"), rep("c")],
        [Stuck("g", "switchover refused: c is not alive and in sync")],
        extra=[SwitchoverRequested("g", "r1", "c")],
    ),
    Case(
        "switchover: fenced master, target has everything: elected",
        rec(in_sync=S("ab"), fence="b", fence_version=7, changed_ms=NOW - 100),
        [rep("a", role="master", fenced_version=7, end=12), rep("b", end=12)],
        [elect("b", "switchover from a")],
    ),
    Case(
        "switchover: fence not acknowledged yet: wait",
        rec(in_sync=S("ab"), fence="b", fence_version=7, changed_ms=NOW - 100),
        [rep("a", role="master", end=12), rep("b", end=12)],
        [],
    ),
    Case(
        "switchover: target behind: wait",
        rec(in_sync=S("ab"), fence="b", fence_version=7, changed_ms=NOW - 100),
        [rep("a", role="master", fenced_version=7, end=12), rep("b", end=11)],
        [],
    ),
    Case(
        "switchover: timed out: the master confirms again",
        rec(in_sync=S("ab"), fence="b", fence_version=7, changed_ms=NOW - 2000),
        [rep("a", role="master", fenced_version=7, end=12), rep("b", end=11)],
        [ResumeConfirming("g", 3, 7, "switchover timed out")],
    ),
    Case(
        "failover takes precedence over an in-sync change",
        rec(in_sync=S("abc")),
        [rep("a", NOW - 3000, role="master"), rep("b"), rep("c", NOW - 1600)],
        [elect("b", "master a silent for 3000 ms", in_sync="b")],
    ),
    Case(
        "registered-only brokers: up or down from their registry lease",
        rec(),
        [MASTER_A, rep("b")],
        [MarkDown("g", 7, S("x"))],
        extra=[Registration("g", "x", False), Registration("g", "y", True)],
    ),
    # Found by the nemesis run (seed 4): a Sentinel failover lost the in-sync set's last
    # shrink, a controller elected a replica that lacked confirmed entries, and the others
    # cut those entries to follow it. Now they will not (role "diverged"), and the broker
    # holding the most confirmed entries is elected at once.
    Case(
        "slaves that will not follow a silent master: the one holding the most confirmed wins",
        rec(in_sync=S("a")),
        [rep("a", NOW - 2000, role="master", end=50, confirmed=40),
         rep("b", role="diverged", log_epoch=2, end=90, confirmed=80),
         rep("c", role="diverged", log_epoch=2, end=95, confirmed=80),
         rep("d", log_epoch=2, end=99, confirmed=60)],
        [elect("c", "master a lacks entries confirmed up to 80 (b, c will not follow it)",
               unclean=True)],
    ),
    Case(
        "slaves that will not follow a live master: it is told to stop confirming first",
        rec(in_sync=S("a")),
        [rep("a", role="master", end=50, confirmed=40),
         rep("b", role="diverged", log_epoch=2, end=90, confirmed=80)],
        [StopConfirming("g", 3, 7, "b", "rescue", rescue=True)],
    ),
    Case(
        "rescue fence not obeyed yet: wait",
        rec(in_sync=S("a"), fence="b", fence_version=7),
        [rep("a", role="master", end=50, confirmed=40),
         rep("b", role="diverged", log_epoch=2, end=90, confirmed=80)],
        [Stuck("g", "rescue: waiting for a to stop")],
    ),
    Case(
        "rescue fence obeyed: the holder is elected, outside the stale in-sync set",
        rec(in_sync=S("a"), fence="b", fence_version=7),
        [rep("a", role="master", end=50, confirmed=40, fenced_version=7),
         rep("b", role="diverged", log_epoch=2, end=90, confirmed=80)],
        [elect("b", "master a lacks entries confirmed up to 80 (b will not follow it)",
               unclean=True)],
    ),
    # Found by the nemesis run (seed 122): Redis lost the election of b at epoch 4 (a
    # failover to a replica without it); the record named a at epoch 3 again. b and c,
    # past epoch 3, would never follow a, so with too few followers a confirmed nothing
    # for as long as it lived. An election now passes their epoch.
    Case(
        "brokers past the record's epoch and a live master: it is told to stop first",
        rec(in_sync=S("a")),
        [rep("a", role="master", end=50, confirmed=40),
         rep("b", role="master", epoch=4, log_epoch=4, end=90, confirmed=80),
         rep("c", epoch=4, log_epoch=4, end=90, confirmed=80)],
        [Demote("g", "b", 4, 3), StopConfirming("g", 3, 7, "b", "rescue", rescue=True)],
    ),
    Case(
        "brokers past the record's epoch, the master stopped: the holder is elected above",
        rec(in_sync=S("a"), fence="b", fence_version=7),
        [rep("a", role="master", end=50, confirmed=40, fenced_version=7),
         rep("b", role="master", epoch=4, log_epoch=4, end=90, confirmed=80),
         rep("c", epoch=4, log_epoch=4, end=90, confirmed=80)],
        [Demote("g", "b", 4, 3),
         elect("b", "the record went back to epoch 3, behind b, c (Redis lost an election)",
               epoch=5, unclean=True)],
    ),
    Case(
        "brokers past the record's epoch, the master alone holds the most: stuck, said",
        rec(in_sync=S("a")),
        [rep("a", role="master", end=90, confirmed=80),
         rep("b", epoch=4, log_epoch=4, end=60, confirmed=40)],
        [Stuck("g", "the record is at epoch 3, behind b; its master a alone holds entries "
                    "confirmed up to 80")],
    ),
    Case(
        "brokers past the record's epoch, its master silent, no in-sync replica: elect above",
        rec(in_sync=S("a")),
        [rep("a", NOW - 3000, role="master", end=50, confirmed=40),
         rep("b", role="master", epoch=4, log_epoch=4, end=90, confirmed=80),
         rep("c", epoch=4, log_epoch=4, end=80, confirmed=80)],
        [Demote("g", "b", 4, 3),
         elect("b", "master a silent for 3000 ms; the record went back to epoch 3, behind b, c "
                    "(Redis lost an election)", epoch=5, unclean=True)],
    ),
    Case(
        "a refusal from before the record's epoch: nothing",
        rec(),
        [MASTER_A, rep("b", role="diverged", epoch=2, confirmed=80)],
        [],
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decide(case: Case) -> None:
    assert decide(case) == case.expect


def test_not_leading_asks_for_the_lease_and_decides_nothing() -> None:
    state = ControllerState(CONFIG)
    step(state, GroupRead(rec()))
    step(state, Heartbeat(rep("a", NOW - 9000)))
    assert step(state, Tick(NOW)) == [HoldLease(0)]
    step(state, LeaseAcquired(4, NOW + 500))
    step(state, LeaseLost("other"))
    assert step(state, Tick(NOW)) == [HoldLease(0)]


def test_lease_renewed_in_its_second_half_and_dropped_when_expired() -> None:
    state = ControllerState(CONFIG)
    step(state, LeaseAcquired(4, NOW + 1001))
    assert step(state, Tick(NOW)) == []
    step(state, LeaseAcquired(4, NOW + 1000))
    assert step(state, Tick(NOW)) == [HoldLease(4)]
    assert step(state, Tick(NOW + 1000)) == [HoldLease(0)]
    assert state.leader is None


def test_an_older_record_is_ignored_unless_redis_restarted() -> None:
    state = ControllerState(CONFIG)
    step(state, GroupRead(rec(version=8)))
    step(state, GroupRead(rec(version=7)))
    assert state.group("g").record.version == 8
    step(state, StoreRestarted(NOW))
    step(state, GroupRead(rec(version=7)))
    assert state.group("g").record.version == 7


def test_a_stuck_reason_is_given_once() -> None:
    state = ControllerState(CONFIG)
    step(state, LeaseAcquired(4, NOW + 1900))
    step(state, GroupRead(rec(in_sync=S("a"))))
    step(state, Heartbeat(rep("a", NOW - 5000)))
    first = step(state, Tick(NOW))
    assert [type(a) for a in first] == [Stuck, MarkDown]
    step(state, GroupRead(rec(in_sync=S("a"), version=8, down=S("a"))))
    assert step(state, Tick(NOW + 100)) == []


def test_after_redis_lost_writes_one_write_leaps_the_version() -> None:
    """Brokers ignore answers older than the record they follow; after a Redis restart or
    Sentinel failover that lost writes, the stored version is below it and a master would
    lose its standing for good (found by the nemesis run: confirms stalled 9.5 s). The
    controller's first write after the restart leaps the version."""
    state = ControllerState(CONFIG)
    step(state, LeaseAcquired(4, NOW + 1900))
    step(state, GroupRead(rec()))
    step(state, StoreRestarted(NOW - 100))
    step(state, GroupRead(rec()))
    for report in (MASTER_A, rep("b")):
        step(state, Heartbeat(report))
    assert step(state, Tick(NOW)) == [MarkDown("g", 7, S(), jump=VERSION_JUMP)]
    step(state, GroupRead(rec(version=7 + 1 + VERSION_JUMP)))
    assert step(state, Tick(NOW + 100)) == []  # once


def test_a_switchover_request_is_acted_on_once() -> None:
    state = ControllerState(CONFIG)
    step(state, LeaseAcquired(4, NOW + 1900))
    step(state, GroupRead(rec()))
    for report in (MASTER_A, rep("b")):
        step(state, Heartbeat(report))
    step(state, SwitchoverRequested("g", "r1", "b"))
    assert step(state, Tick(NOW)) == [StopConfirming("g", 3, 7, "b", "r1")]
    step(state, SwitchoverRequested("g", "r1", "b"))  # still in Redis until the write lands
    assert step(state, Tick(NOW + 100)) == []
