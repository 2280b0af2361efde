"""What the decision step is told. Apply makes these from what it reads in Redis and from the
results of its writes; the simulation makes the same ones, and its store sends a lease result
or a group record as the event itself (controller/sim/messages.py). Times are Redis's, in ms."""

from __future__ import annotations

from dataclasses import dataclass

from meta.groups.records import GroupRecord, LagReport, ReplicaReport


@dataclass(frozen=True, slots=True)
class Tick:
    """Decide now. ``now_ms`` is Redis's clock, read with the state that came before."""

    now_ms: int


@dataclass(frozen=True, slots=True)
class LeaseAcquired:
    """This controller holds the leader lease (taken or renewed) until ``expires_ms``."""

    token: int
    expires_ms: int


@dataclass(frozen=True, slots=True)
class LeaseLost:
    holder: str  # who holds it now ("" if nobody)


@dataclass(frozen=True, slots=True)
class StoreRestarted:
    """Redis's run id changed: it may have lost its last writes (AOF everysec), heartbeat
    times included, so no master is judged silent until a full election silence passes."""

    now_ms: int


@dataclass(frozen=True, slots=True)
class GroupRead:
    record: GroupRecord


@dataclass(frozen=True, slots=True)
class Heartbeat:
    report: ReplicaReport


@dataclass(frozen=True, slots=True)
class LagReported:
    lag: LagReport


@dataclass(frozen=True, slots=True)
class Registration:
    """A broker in the registry (``mqgw broker --meta``), with or without heartbeat records:
    liveness only, from its registry lease. It is never elected on this alone."""

    group: str
    broker_id: str
    alive: bool


@dataclass(frozen=True, slots=True)
class SwitchoverRequested:
    group: str
    request_id: str
    target: str  # "" = the best in-sync replica


Event = (
    Tick
    | LeaseAcquired
    | LeaseLost
    | StoreRestarted
    | GroupRead
    | Heartbeat
    | LagReported
    | Registration
    | SwitchoverRequested
)
