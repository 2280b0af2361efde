"""The broker side of the controller contract, as pure helpers (no I/O, time passed in).

The simulation's brokers are built on these, so the simulation checks them; the replication
work in ``storage/`` is meant to use them too. docs/controller.md states the contract:

- ``Standing``: a master confirms only while its last heartbeat that the store acknowledged
  (answer: "you are master at your epoch, not fenced") was *sent* less than
  ``master_timeout_ms`` ago by its own clock. The controller elects another only when Redis
  stored nothing from it for ``master_timeout_ms + safety_margin_ms``, so the old master has
  stopped before the new one starts, whatever the network does with its heartbeats.
- ``InSyncTracker``: which replicas a confirm waits for. A replica leaves that set only once
  a record without it was read back (the controller shrank the set, fenced by the epoch); a
  replica is counted *before* the master asks for it to join, and an ask that is withdrawn
  stops counting only once a heartbeat without it was stored and the record still lacks it.
  A replica may join only once it has the master's whole log as of the start of its epoch
  (any of it may have been confirmed by an earlier master) and its confirm offset. So every
  member of the stored set holds every confirmed entry.
- ``Grants`` and ``Promise`` (rule 14, replica standing): a master may also confirm while
  every replica a confirm waits for promised, on an answer it stamped, to follow no other
  master for ``master_timeout_ms``; the replica keeps that promise (and a margin for clock
  drift) by its own clock, so it is elected and acts only once the master's grant ran out.
- ``common_point``: where a returning broker truncates, from the epoch files.
- ``stale``: heartbeat answers may arrive out of order; an older record is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from meta.groups.records import GroupRecord

EpochFile = Sequence[tuple[int, int]]  # (epoch, start offset), oldest first


def stale(record: GroupRecord, than: GroupRecord | None) -> bool:
    """``record`` is older than the one already followed (an answer overtaken by another).
    An equal one is not stale: later answers repeat the record and still count."""
    return than is not None and (record.epoch, record.version) < (than.epoch, than.version)


@dataclass(slots=True)
class Standing:
    """A master's right to confirm, in its own clock's ms."""

    until_ms: int = 0

    def grant(self, sent_ms: int, master_timeout_ms: int) -> None:
        """An acknowledged heartbeat, sent at ``sent_ms``, said: master, not fenced."""
        self.until_ms = max(self.until_ms, sent_ms + master_timeout_ms)

    def revoke(self) -> None:
        self.until_ms = 0

    def valid(self, now_ms: int) -> bool:
        return now_ms < self.until_ms


ANYONE = "*"  # a promise to whichever master: made before a crash, to someone unknown


@dataclass(slots=True)
class Grants:
    """A master's standing from its replicas' promises, in its own clock's ms."""

    until_ms: dict[str, int] = field(default_factory=dict)

    def grant(self, replica: str, echo_ms: int, master_timeout_ms: int) -> None:
        """``replica`` promised on an answer this master stamped ``echo_ms``."""
        self.until_ms[replica] = max(self.until_ms.get(replica, 0), echo_ms + master_timeout_ms)

    def revoke(self) -> None:
        self.until_ms = {}

    def cover(self, required: frozenset[str], min_in_sync: int, now_ms: int) -> bool:
        """Every replica a confirm waits for holds a promise (and there is one, and enough
        of them for min_in_sync)."""
        if not required or 1 + len(required) < min_in_sync:
            return False
        return all(self.until_ms.get(replica, 0) > now_ms for replica in required)


@dataclass(slots=True)
class Promise:
    """A slave's promise to follow no other master (and not to become one) until
    ``until_ms`` by its own clock."""

    to: str = ""
    until_ms: int = 0

    def make(self, master: str, now_ms: int, master_timeout_ms: int, margin_ms: int) -> None:
        """On receiving an answer from ``master`` it may count on."""
        self.to, self.until_ms = master, now_ms + master_timeout_ms + margin_ms

    def release(self) -> None:
        """The master is fenced: it confirms nothing more this term."""
        self.to, self.until_ms = "", 0

    def binds(self, master: str, now_ms: int) -> bool:
        """Whether the promise still keeps this broker from leading or following
        ``master`` (itself, when it is the one elected)."""
        if not self.to or self.to == master:
            return False
        if now_ms < self.until_ms:
            return True
        self.release()
        return False


@dataclass(slots=True)
class InSyncTracker:
    """The master's set of replicas a confirm waits for (itself not included)."""

    me: str
    stored: frozenset[str] = frozenset()  # the in-sync set of the last record read, minus me
    epoch_start: int = 0  # the master's end offset when its epoch began
    pending: set[str] = field(default_factory=set)  # counted and asked for (caught_up)
    withdrawing: dict[str, int] = field(default_factory=dict)  # id -> first seq not asking

    def required(self) -> frozenset[str]:
        return self.stored | self.pending | frozenset(self.withdrawing)

    def asked(self) -> frozenset[str]:
        """The ``caught_up`` list of the next heartbeat."""
        return frozenset(self.pending)

    def review(
        self,
        acks: Mapping[str, int],
        kept_up_ms: Mapping[str, int],
        end: int,
        confirmed: int,
        now_ms: int,
        lag_timeout_ms: int,
        next_seq: int,
    ) -> frozenset[str]:
        """Before each heartbeat (``next_seq``): withdraw or report replicas that fell
        behind, count those that caught up. ``acks``: offset each replica of this epoch has;
        ``kept_up_ms``: when each last acknowledged progress or was level with ``end``.
        Returns the stored replicas to report lagging."""
        lagging = set()
        for replica in sorted(self.required()):
            behind = acks.get(replica, 0) < end
            if behind and now_ms - kept_up_ms.get(replica, 0) > lag_timeout_ms:
                if replica in self.pending:
                    self.withdraw(replica, next_seq)
                elif replica in self.stored:
                    lagging.add(replica)
        floor = max(confirmed, self.epoch_start)
        for replica, acked in sorted(acks.items()):
            fresh = now_ms - kept_up_ms.get(replica, 0) <= lag_timeout_ms
            if replica not in self.required() and acked >= floor and fresh:
                self.join(replica)
        return frozenset(lagging)

    def join(self, replica: str) -> None:
        """``replica`` has every confirmed entry and follows this epoch: count it from now
        on, then ask for it."""
        if replica in self.stored or replica == self.me:
            return
        self.withdrawing.pop(replica, None)
        self.pending.add(replica)

    def withdraw(self, replica: str, next_seq: int) -> None:
        """Stop asking for ``replica`` (it fell behind before it joined); it still counts
        until the answer to heartbeat ``next_seq`` or later shows the record without it."""
        if replica in self.pending:
            self.pending.discard(replica)
            self.withdrawing[replica] = next_seq

    def on_record(self, in_sync: frozenset[str], answered_seq: int) -> None:
        """Follow the stored set from the answer to heartbeat ``answered_seq``."""
        self.stored = in_sync - {self.me}
        self.pending -= self.stored
        for replica, since in list(self.withdrawing.items()):
            if replica in self.stored or answered_seq >= since:
                del self.withdrawing[replica]


def epoch_ranges(epochs: EpochFile, end: int) -> dict[int, tuple[int, int]]:
    """epoch -> [start, end) of its entries."""
    ranges = {}
    for i, (epoch, start) in enumerate(epochs):
        stop = epochs[i + 1][1] if i + 1 < len(epochs) else end
        ranges[epoch] = (start, stop)
    return ranges


def common_point(local: EpochFile, local_end: int, master: EpochFile, master_end: int) -> int:
    """The offset up to which the local log equals the master's (RocketMQ's epoch-file walk):
    the newest epoch both have, up to where the shorter of the two has it. One master writes
    an epoch, so two logs that both hold entries of epoch E agree up to where either stops."""
    theirs = epoch_ranges(master, master_end)
    ours = epoch_ranges(local, local_end)
    for epoch, _start in reversed(local):
        if epoch in theirs:
            return min(ours[epoch][1], theirs[epoch][1])
    return 0
