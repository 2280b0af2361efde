"""What the controller reads from Redis each tick, and how it becomes events. Pure: the
Redis apply and the simulation both build a ``Snapshot`` and decide on it with
``Observer.decide``."""

from __future__ import annotations

from dataclasses import dataclass

from controller.actions import Action
from controller.decide import ControllerState, step
from controller.events import (
    Event,
    GroupRead,
    Heartbeat,
    LagReported,
    LeaseLost,
    Registration,
    StoreRestarted,
    SwitchoverRequested,
    Tick,
)
from meta.groups.records import GroupRecord, LagReport, ReplicaReport


@dataclass(frozen=True, slots=True)
class Snapshot:
    now_ms: int  # Redis TIME, read in the same step as the rest
    run_id: str  # changes when Redis restarts
    lease_holder: str  # "name token" of the leader lease, "" if free
    records: tuple[GroupRecord, ...] = ()
    replicas: tuple[tuple[ReplicaReport, LagReport | None], ...] = ()
    registrations: tuple[tuple[str, str, bool], ...] = ()  # (group, id, lease alive)
    switchovers: tuple[tuple[str, str, str], ...] = ()  # (group, request id, target)


@dataclass(slots=True)
class Observer:
    """Turns successive snapshots into events for one controller."""

    name: str
    run_id: str = ""

    def decide(self, snapshot: Snapshot, state: ControllerState) -> list[Action]:
        """Feed every event of ``snapshot`` to the decision step; its actions, in order."""
        actions: list[Action] = []
        for event in self.events(snapshot, state):
            actions += step(state, event)
        return actions

    def events(self, snapshot: Snapshot, state: ControllerState) -> list[Event]:
        found: list[Event] = []
        if self.run_id and snapshot.run_id != self.run_id:
            found.append(StoreRestarted(snapshot.now_ms))
        self.run_id = snapshot.run_id
        leader = state.leader
        if leader is not None and snapshot.lease_holder != f"{self.name} {leader.token}":
            found.append(LeaseLost(snapshot.lease_holder.rpartition(" ")[0]))
        found += [GroupRead(record) for record in snapshot.records]
        for report, lag in snapshot.replicas:
            found.append(Heartbeat(report))
            if lag is not None:
                found.append(LagReported(lag))
        found += [Registration(g, b, alive) for g, b, alive in snapshot.registrations]
        found += [SwitchoverRequested(g, r, t) for g, r, t in snapshot.switchovers]
        found.append(Tick(snapshot.now_ms))
        return found
