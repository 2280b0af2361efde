"""What the decision step asks for. Every write names the record version it was decided on
(``expect_version``) and is refused by the script if the record moved on, or if the lease
token is not the writer's: a stale decision never lands. Apply (Redis) and the simulation
carry them out; ``docs/controller.md`` lists the script behind each."""

from __future__ import annotations

from dataclasses import dataclass

from meta.groups.records import GroupRecord


@dataclass(frozen=True, slots=True)
class HoldLease:
    """Take the leader lease (``token`` 0) or renew it (our token)."""

    token: int


@dataclass(frozen=True, slots=True)
class Elect:
    """A new master at a new epoch. The script lets it through only if the old master cannot
    be confirming: silent for the election silence (Redis time), fenced for a switchover,
    or resigned (restarted); a group's first election has no old master."""

    group: str
    master: str
    min_epoch: int  # the new epoch is max(stored epoch + 1, min_epoch)
    in_sync: frozenset[str]
    expect_epoch: int
    expect_version: int
    previous: str  # the master being replaced ("" for a group's first)
    reason: str
    unclean: bool = False  # the new master is not in the in-sync set (allowed by config)


@dataclass(frozen=True, slots=True)
class SetInSync:
    """Shrink or expand the in-sync set within the epoch. ``added`` must still be asked for
    by the master's stored heartbeat (it counts them for confirms before it asks)."""

    group: str
    epoch: int
    expect_version: int
    in_sync: frozenset[str]
    added: frozenset[str]
    reason: str


@dataclass(frozen=True, slots=True)
class StopConfirming:
    """Planned switchover, phase 1: the master stops confirming and hands over to
    ``target`` once it has everything. A rescue stops a master that lacks confirmed entries
    (slaves "diverged" from it) so that ``target``, which holds them, can be elected: the
    target need not be in the stored in-sync set, which is the stale part."""

    group: str
    epoch: int
    expect_version: int
    target: str
    request_id: str
    rescue: bool = False


@dataclass(frozen=True, slots=True)
class ResumeConfirming:
    """A switchover that did not complete in time: the master confirms again."""

    group: str
    epoch: int
    expect_version: int
    reason: str


@dataclass(frozen=True, slots=True)
class MarkDown:
    """The brokers taken for dead. With ``jump``, the version also leaps by that much: after
    Redis lost writes (a restart, a Sentinel failover) brokers may follow a version above the
    stored one and ignore every answer below it, so a master would lose its standing."""

    group: str
    expect_version: int
    down: frozenset[str]
    jump: int = 0


@dataclass(frozen=True, slots=True)
class Demote:
    """A broker acts as master though the record says otherwise (an old master back).
    Its next heartbeat answer demotes it; this tells gateways at once (a change entry)."""

    group: str
    broker_id: str
    stale_epoch: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Stuck:
    """Nothing can be done now; logged once per reason."""

    group: str
    reason: str


Write = Elect | SetInSync | StopConfirming | ResumeConfirming | MarkDown
Action = HoldLease | Write | Demote | Stuck


@dataclass(frozen=True, slots=True)
class WriteResult:
    ok: bool
    reason: str  # why the script refused it ("" when ok)
    record: GroupRecord | None  # the record it wrote (None when refused)


# Why a script refuses a write: the Lua scripts and the simulation's store say the same.
NOT_LEADER = "not the leader"
STALE = "the record changed"
NOT_SILENT = "the master may still be confirming"
NOT_IN_SYNC = "not in the in-sync set"
NOT_ASKED = "the master does not ask for it"
BAD_FENCE = "no switchover in that state"
