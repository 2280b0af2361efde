"""The simulation's controllers and clients.

``SimController`` runs the real decision step (``controller.decide.step``) and a simulated
apply: every tick it reads the store (one ``Snapshot``, as the Redis apply reads one), feeds
the events, and sends each action as a script call. ``Publisher`` is a gateway publishing with
confirms: it keeps what is unconfirmed and sends it again (a batch id makes that idempotent on
the broker) to the master it last read from the store, as gateways learn it from the change
feed. ``Consumer`` reads up to the confirm offset from whichever broker it takes for master.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from controller.actions import Demote, Elect, HoldLease, Stuck
from controller.decide import ControllerState, step
from controller.events import GroupRead, LeaseAcquired, LeaseLost
from controller.sim.messages import (
    HoldCall,
    PublishCall,
    PublishReply,
    ReadCall,
    ReadLogCall,
    ReadLogReply,
    ReadReply,
    RecordCall,
    WriteCall,
    WriteReply,
)
from controller.sim.world import Node, World
from controller.snapshot import Observer
from meta.groups.records import GroupRecord
from meta.groups.timing import ControllerConfig

if TYPE_CHECKING:
    from controller.sim.checks import Oracle


class SimController(Node):
    def __init__(
        self, world: World, name: str, store: str, config: ControllerConfig, oracle: Oracle
    ) -> None:
        super().__init__(world, name)
        self.store, self.config, self.oracle = store, config, oracle
        self.state = ControllerState(config)
        self.observer = Observer(name)
        self.elections = 0

    @property
    def holder(self) -> str:
        return f"{self.name}#{self.incarnation}"  # unique per process start

    def on_start(self) -> None:
        self.state = ControllerState(self.config)
        self.observer = Observer(self.holder)
        self._tick()

    def _tick(self) -> None:
        self.send(self.store, ReadCall(self.incarnation))
        self.timer(self.config.tick_ms, self._tick)

    def receive(self, src: str, message: Any) -> None:
        match message:
            case ReadReply(snapshot):
                for action in self.observer.decide(snapshot, self.state):
                    self._apply(action)
            case LeaseAcquired() | LeaseLost():  # the store's answer to HoldCall
                step(self.state, message)
            case WriteReply(action, result):
                if result.record is not None:
                    step(self.state, GroupRead(result.record))
                    self.elections += isinstance(action, Elect)

    def _apply(self, action: Any) -> None:
        match action:
            case HoldLease():
                self.send(self.store, HoldCall(self.incarnation, self.holder))
            case Demote() | Stuck():
                pass  # notices: the Redis apply logs them
            case _:
                leader = self.state.leader
                if leader is not None:
                    holder = f"{self.holder} {leader.token}"
                    self.send(self.store, WriteCall(self.incarnation, holder, action))


class Follower(Node):
    """A client that follows the group record to find the master."""

    def __init__(
        self, world: World, name: str, store: str, group: str, refresh_ms: int, oracle: Oracle
    ) -> None:
        super().__init__(world, name)
        self.store, self.group, self.refresh_ms, self.oracle = store, group, refresh_ms, oracle
        self.record = GroupRecord(group)

    def on_start(self) -> None:
        self._refresh()

    def _refresh(self) -> None:
        self.send(self.store, RecordCall(self.incarnation, self.group))
        self.timer(self.refresh_ms, self._refresh)

    def receive(self, src: str, message: Any) -> None:
        if isinstance(message, GroupRead):  # the store's answer to RecordCall
            record = message.record
            if (record.epoch, record.version) >= (self.record.epoch, self.record.version):
                moved = record.master != self.record.master
                self.record = record
                if moved:
                    self.master_changed()

    def master_changed(self) -> None: ...


class Publisher(Follower):
    def __init__(
        self, world: World, name: str, store: str, group: str, refresh_ms: int, oracle: Oracle
    ) -> None:
        super().__init__(world, name, store, group, refresh_ms, oracle)
        self.next_id = 0
        self.request = 0
        self.unconfirmed: dict[int, int] = {}  # message id -> local ms last sent (0: never)
        self.interval_ms = 100
        self.resend_ms = 400
        self.window = 16

    def on_start(self) -> None:
        super().on_start()
        self._publish()

    def _publish(self) -> None:
        self.timer(self.interval_ms, self._publish)
        if len(self.unconfirmed) < self.window:
            self.next_id += 1
            self.unconfirmed[self.next_id] = 0
        self._send_due()

    def _send_due(self) -> None:
        now = self.now()
        due = [m for m, sent in self.unconfirmed.items() if not sent or now - sent > self.resend_ms]
        if not due or not self.record.master:
            return
        batch = tuple(due[:8])
        for msg in batch:
            self.unconfirmed[msg] = now
        self.request += 1
        self.send(self.record.master, PublishCall(self.incarnation, self.request, batch))

    def master_changed(self) -> None:
        """Re-send everything unconfirmed to the new master at once (gateways do)."""
        self.unconfirmed = dict.fromkeys(self.unconfirmed, 0)
        self._send_due()

    def receive(self, src: str, message: Any) -> None:
        if isinstance(message, PublishReply):
            for msg in message.confirmed:
                if self.unconfirmed.pop(msg, None) is not None:
                    self.oracle.client_confirmed(msg)
            return
        super().receive(src, message)


class Consumer(Follower):
    def __init__(
        self, world: World, name: str, store: str, group: str, refresh_ms: int, oracle: Oracle
    ) -> None:
        super().__init__(world, name, store, group, refresh_ms, oracle)
        self.position = 0
        self.interval_ms = 250

    def on_start(self) -> None:
        super().on_start()
        self._read()

    def _read(self) -> None:
        self.timer(self.interval_ms, self._read)
        if self.record.master:
            self.send(self.record.master, ReadLogCall(self.incarnation, self.position))

    def receive(self, src: str, message: Any) -> None:
        if isinstance(message, ReadLogReply):
            if message.start == self.position:
                for entry in message.entries:
                    self.oracle.read(self.position, entry)
                    self.position += 1
            return
        super().receive(src, message)
