"""The invariants, checked as the simulation runs (at every step that could break one).

``history`` is the one confirmed prefix: every entry any broker ever counted as confirmed,
by offset. Named checks (a failure says which):

- ``one-confirmed-prefix``: each broker's confirmed entries agree with ``history``.
- ``no-confirmed-write-lost``: a message confirmed to a client is in ``history``, and every
  broker of the stored in-sync set holds all of ``history`` (so an election cannot lose it).
- ``one-master-confirming``: at no instant can two brokers confirm (role, standing, no fence);
  in particular at most one master per epoch (``one-master-per-epoch``).
- ``epochs-monotonic``: a broker's highest epoch, the record's epoch and the epochs along
  ``history`` never go down.
- ``no-truncation-of-confirmed``: no broker truncates an entry of ``history`` (what was
  confirmed, and so what anyone read), by a rejoin or a crash.
- ``offsets-not-reused``: a consumer reading offset N always gets ``history[N]``, and no
  message is confirmed twice (re-sent appends are stored once).
- ``failover-within-bound``: checked by the runner in calm windows (sim/run.py).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from controller.sim.messages import Entry
from meta.groups.records import GroupRecord

if TYPE_CHECKING:
    from controller.sim.world import World


class CheckedBroker(Protocol):
    """What the oracle reads of a simulated broker (controller/sim/broker.py)."""

    @property
    def name(self) -> str: ...

    @property
    def log(self) -> Sequence[Entry]: ...

    @property
    def confirmed(self) -> int: ...

    @property
    def role(self) -> str: ...

    @property
    def role_epoch(self) -> int: ...

    def can_confirm(self) -> bool: ...


class SimFailure(AssertionError):
    def __init__(self, invariant: str, detail: str, now_ms: int, step: int) -> None:
        super().__init__(f"{invariant} at t={now_ms} ms, step {step}: {detail}")
        self.invariant = invariant
        self.detail = detail


class Oracle:
    def __init__(self, world: World) -> None:
        self.world = world
        self.brokers: dict[str, CheckedBroker] = {}
        self.history: list[Entry] = []
        self.in_history: set[int] = set()
        self.client_acked: set[int] = set()
        self.masters: dict[int, str] = {}  # epoch -> the broker that became master at it
        self.record = GroupRecord("")
        self.verified: dict[str, int] = {}  # broker -> prefix of its log known to match
        self.last_client_confirm_ms = -1
        self.confirm_times: list[int] = []
        self.reads = 0

    def fail(self, invariant: str, detail: str) -> None:
        raise SimFailure(invariant, detail, self.world.now, self.world.steps)

    # -- history --

    def _verify(self, broker: CheckedBroker, upto: int, extend: bool) -> None:
        """``broker.log[:upto]`` agrees with history (and extends it if ``extend``)."""
        log, history, start = broker.log, self.history, self.verified.get(broker.name, 0)
        for offset in range(start, upto):
            entry = log[offset]
            if offset < len(history):
                if history[offset] != entry:
                    self.fail(
                        "one-confirmed-prefix",
                        f"{broker.name} has {entry} at {offset}, confirmed is {history[offset]}",
                    )
                continue
            if not extend:
                self.fail("no-confirmed-write-lost", f"{broker.name} lacks offset {offset}")
            if history and entry[0] < history[-1][0]:
                self.fail("epochs-monotonic", f"epoch {entry[0]} after {history[-1][0]}")
            if entry[1] in self.in_history:
                self.fail("offsets-not-reused", f"message {entry[1]} confirmed twice")
            history.append(entry)
            self.in_history.add(entry[1])
        self.verified[broker.name] = max(start, upto)

    def confirmed(self, broker: CheckedBroker) -> None:
        if broker.role == "master":
            self._only_confirmer(broker)
        grew = broker.confirmed > len(self.history)
        self._verify(broker, broker.confirmed, extend=True)
        if grew:
            self._check_in_sync()

    def _check_in_sync(self) -> None:
        for name in sorted(self.record.in_sync):
            broker = self.brokers[name]
            if len(broker.log) < len(self.history):
                self.fail(
                    "no-confirmed-write-lost",
                    f"in-sync {name} has {len(broker.log)} entries, "
                    f"{len(self.history)} are confirmed",
                )
            self._verify(broker, len(self.history), extend=False)

    def truncating(self, broker: CheckedBroker, end: int, why: str) -> None:
        log, history = broker.log, self.history
        for offset in range(end, min(len(log), len(history))):
            if log[offset] == history[offset]:
                self.fail(
                    "no-truncation-of-confirmed",
                    f"{broker.name} truncates confirmed offset {offset} ({why})",
                )
        self.verified[broker.name] = min(self.verified.get(broker.name, 0), end)

    def crashed(self, broker: CheckedBroker) -> None:
        if broker.name in self.record.in_sync:
            self._check_in_sync()

    def client_confirmed(self, msg: int) -> None:
        if msg not in self.in_history:
            self.fail("no-confirmed-write-lost", f"message {msg} confirmed but not in history")
        self.client_acked.add(msg)
        self.last_client_confirm_ms = self.world.now
        self.confirm_times.append(self.world.now)

    def first_confirm_after(self, since_ms: int) -> int:
        return self.confirm_times[bisect_right(self.confirm_times, since_ms)]

    def read(self, offset: int, entry: Entry) -> None:
        self.reads += 1
        if offset >= len(self.history) or self.history[offset] != entry:
            found = self.history[offset] if offset < len(self.history) else None
            self.fail("offsets-not-reused", f"read {entry} at {offset}, confirmed is {found}")

    # -- masters and epochs --

    def master(self, broker: CheckedBroker, epoch: int) -> None:
        other = self.masters.setdefault(epoch, broker.name)
        if other != broker.name:
            self.fail("one-master-per-epoch", f"{broker.name} and {other} at epoch {epoch}")
        if broker.log and broker.log[-1][0] > epoch:
            self.fail("epochs-monotonic", f"{broker.name} master at {epoch} below its log")

    def standing(self, broker: CheckedBroker) -> None:
        self._only_confirmer(broker)

    def _only_confirmer(self, broker: CheckedBroker) -> None:
        for other in self.brokers.values():
            if other is not broker and other.can_confirm():
                self.fail(
                    "one-master-confirming",
                    f"{broker.name} (epoch {broker.role_epoch}) and {other.name} "
                    f"(epoch {other.role_epoch}) can both confirm",
                )

    def epoch_seen(self, broker: CheckedBroker, old: int, new: int) -> None:
        if new < old:
            self.fail("epochs-monotonic", f"{broker.name} went from epoch {old} to {new}")

    def record_written(self, record: GroupRecord) -> None:
        if record.epoch < self.record.epoch:
            self.fail("epochs-monotonic", f"record epoch {self.record.epoch} -> {record.epoch}")
        self.record = record
        self._check_in_sync()
