"""The records the controller and the brokers exchange through Redis, and their encoding.

Two records, each with one writer:
- ``GroupRecord`` (``mqgw:group:<group>``): written only by the leading controller, through
  scripts that check its lease token. It is the truth about a group: who is master, at which
  epoch, which replicas are in sync, whether the master must stop confirming.
- the heartbeat record (``mqgw:replica:<group>:<id>``): written only by its broker, through
  the heartbeat script that stamps it with Redis's time and answers with the group record.
  It decodes into a ``ReplicaReport`` (where the broker stands) and, for a master, a
  ``LagReport`` (which replicas it wants out of or into the in-sync set).

Both are Redis hashes of strings; sets are JSON lists, sorted, so equal records encode equally.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, cast

# "diverged": a slave that will not follow the record's master, because doing so would cut
# entries it knows were confirmed (the master was elected from a record Redis lost writes of).
Role = Literal["master", "slave", "none", "diverged"]
ROLES: frozenset[str] = frozenset(("master", "slave", "none", "diverged"))
SEQ_BOOT_SHIFT = 32  # heartbeat seq = boot << 32 | n: a restarted broker's seqs are larger


@dataclass(frozen=True, slots=True)
class GroupRecord:
    group: str
    epoch: int = 0  # the master's term; 0 = no master was ever elected
    master: str = ""  # broker id; "" until the first election
    in_sync: frozenset[str] = frozenset()  # always holds the master
    version: int = 0  # +1 on every write; every decision is made on one version
    fence: str = ""  # switchover target: while set, the master must not confirm
    fence_version: int = 0  # the version that set ``fence`` (the master echoes it)
    down: frozenset[str] = frozenset()  # brokers the controller takes for dead
    token: int = 0  # fencing token of the controller that wrote it
    changed_ms: int = 0  # Redis time of the write


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """Where a broker stands, as its last stored heartbeat says."""

    group: str
    broker_id: str
    seq: int  # strictly increasing per broker: a stale or duplicated heartbeat is not stored
    epoch: int  # the highest epoch the broker has seen (it persists it)
    role: Role  # what it acts as, at ``epoch``
    log_epoch: int  # epoch of its last log entry (0: empty log)
    end: int  # end offset of its log
    confirmed: int  # its confirm offset
    priority: int = 0  # election preference among equals: lower first
    fenced_version: int = 0  # as master: the fence version it obeys (0: none)
    # It restarted after acting as master at this epoch (its unflushed tail may be gone and
    # slaves may hold entries it lost): it will not be master again at this epoch or below.
    resigned_epoch: int = 0
    address: str = ""
    at_ms: int = 0  # Redis time at which it was stored

    def rank(self) -> tuple[int, int, int, str]:
        """Election order, best first when sorted: (epoch, end offset) of the log, then
        priority, then id so that ties break the same way in every controller."""
        return (-self.log_epoch, -self.end, self.priority, self.broker_id)


@dataclass(frozen=True, slots=True)
class LagReport:
    """A master's requests about the in-sync set, carried by its heartbeat record."""

    group: str
    broker_id: str
    epoch: int
    lagging: frozenset[str] = frozenset()  # in the set, not keeping up: take them out
    caught_up: frozenset[str] = frozenset()  # already counted for confirms: put them in


def _ids(value: Iterable[str]) -> str:
    return json.dumps(sorted(value), separators=(",", ":"))


def _id_set(text: str | None) -> frozenset[str]:
    return frozenset(str(x) for x in json.loads(text)) if text else frozenset()


def record_fields(record: GroupRecord) -> dict[str, str]:
    return {
        "epoch": str(record.epoch),
        "master": record.master,
        "in_sync": _ids(record.in_sync),
        "version": str(record.version),
        "fence": record.fence,
        "fence_version": str(record.fence_version),
        "down": _ids(record.down),
        "token": str(record.token),
        "changed_ms": str(record.changed_ms),
    }


def parse_record(group: str, fields: Mapping[str, str]) -> GroupRecord:
    """A record from its hash; an absent hash (no fields) is the record of a new group."""
    return GroupRecord(
        group=group,
        epoch=int(fields.get("epoch", 0)),
        master=fields.get("master", ""),
        in_sync=_id_set(fields.get("in_sync")),
        version=int(fields.get("version", 0)),
        fence=fields.get("fence", ""),
        fence_version=int(fields.get("fence_version", 0)),
        down=_id_set(fields.get("down")),
        token=int(fields.get("token", 0)),
        changed_ms=int(fields.get("changed_ms", 0)),
    )


def heartbeat_fields(report: ReplicaReport, lag: LagReport | None) -> dict[str, str]:
    """What a broker sends to the heartbeat script (it adds ``at_ms`` itself)."""
    return {
        "seq": str(report.seq),
        "epoch": str(report.epoch),
        "role": report.role,
        "log_epoch": str(report.log_epoch),
        "end": str(report.end),
        "confirmed": str(report.confirmed),
        "priority": str(report.priority),
        "fenced_version": str(report.fenced_version),
        "resigned_epoch": str(report.resigned_epoch),
        "address": report.address,
        "lagging": _ids(lag.lagging if lag else ()),
        "caught_up": _ids(lag.caught_up if lag else ()),
    }


def parse_heartbeat(
    group: str, broker_id: str, fields: Mapping[str, str]
) -> tuple[ReplicaReport, LagReport | None]:
    role = fields.get("role", "none")
    report = ReplicaReport(
        group=group,
        broker_id=broker_id,
        seq=int(fields.get("seq", 0)),
        epoch=int(fields.get("epoch", 0)),
        role=cast(Role, role if role in ROLES else "none"),
        log_epoch=int(fields.get("log_epoch", 0)),
        end=int(fields.get("end", 0)),
        confirmed=int(fields.get("confirmed", 0)),
        priority=int(fields.get("priority", 0)),
        fenced_version=int(fields.get("fenced_version", 0)),
        resigned_epoch=int(fields.get("resigned_epoch", 0)),
        address=fields.get("address", ""),
        at_ms=int(fields.get("at_ms", 0)),
    )
    if report.role != "master":
        return report, None
    lag = LagReport(
        group,
        broker_id,
        report.epoch,
        _id_set(fields.get("lagging")),
        _id_set(fields.get("caught_up")),
    )
    return report, lag
