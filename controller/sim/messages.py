"""Every message of the simulation. A request carries its sender's incarnation (``inc``)
so that the reply goes to that incarnation only. The store answers ``HoldCall`` and
``RecordCall`` with the controller's own events (``LeaseAcquired`` or ``LeaseLost``, as
``RedisApply.hold`` does; ``GroupRead``), so those answers have no message type here."""

from __future__ import annotations

from dataclasses import dataclass

from controller.actions import Write, WriteResult
from controller.snapshot import Snapshot
from meta.groups.records import GroupRecord, LagReport, ReplicaReport

Entry = tuple[int, int]  # (epoch, message id): one commitlog record


# -- to and from the store (Redis) --


@dataclass(frozen=True, slots=True)
class HoldCall:
    inc: int
    holder: str


@dataclass(frozen=True, slots=True)
class HeartbeatCall:
    inc: int
    report: ReplicaReport
    lag: LagReport | None
    sent_ms: int  # the broker's clock when it sent this


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    record: GroupRecord
    sent_ms: int
    seq: int


@dataclass(frozen=True, slots=True)
class ReadCall:
    inc: int


@dataclass(frozen=True, slots=True)
class ReadReply:
    snapshot: Snapshot


@dataclass(frozen=True, slots=True)
class WriteCall:
    inc: int
    holder: str
    action: Write


@dataclass(frozen=True, slots=True)
class WriteReply:
    action: Write
    result: WriteResult


@dataclass(frozen=True, slots=True)
class RecordCall:
    inc: int
    group: str


# -- replication, between a slave and its master --


@dataclass(frozen=True, slots=True)
class SyncCall:
    inc: int
    epoch: int


@dataclass(frozen=True, slots=True)
class SyncReply:
    epoch: int
    epochs: tuple[tuple[int, int], ...]
    end: int


@dataclass(frozen=True, slots=True)
class PullCall:
    """Also the acknowledgement: the slave has (durably) everything before ``start``."""

    inc: int
    epoch: int
    start: int
    # Replica standing (rule 14): the master's clock from the answer this pull promises on,
    # -1 when it promises nothing.
    echo_ms: int = -1


@dataclass(frozen=True, slots=True)
class PullReply:
    epoch: int
    start: int
    entries: tuple[Entry, ...]
    confirmed: int
    sent_ms: int = 0  # the master's clock (what a promise counts from)
    fenced: bool = False  # a fenced master confirms nothing more: no promise holds


# -- clients (a gateway publishing with confirms, a consumer) --


@dataclass(frozen=True, slots=True)
class PublishCall:
    inc: int
    request: int
    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PublishReply:
    request: int
    confirmed: tuple[int, ...]  # empty: refused (nack), publish elsewhere later


@dataclass(frozen=True, slots=True)
class ReadLogCall:
    inc: int
    start: int


@dataclass(frozen=True, slots=True)
class ReadLogReply:
    start: int
    entries: tuple[Entry, ...]
