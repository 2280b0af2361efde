"""The nemesis: what goes wrong, and when.

A run alternates *storms* and *calm windows*. In a storm, faults come every 0.1-1 s: a broker
crashes (the master half the time) or comes back, a controller crashes (the leader half the
time), Redis restarts, a node is cut off from some of the others (the master from Redis and
the controllers only, a third of those times: the isolated-master case of RocketMQ #7017),
partitions heal; the whole storm drops, duplicates and slows messages at rates drawn for it.

A calm window heals the network, brings Redis and a controller back, and each crashed broker
back with probability 1/2; one second in, half the windows kill the master (the drill whose
time to the next confirm is the failover time). Then, if a healthy quorum exists (a broker of
the stored in-sync set is up and at least ``min_in_sync`` brokers are), a client confirm must
come within the bound after the last disruption (``failover-within-bound``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.sim.actors import SimController
from controller.sim.broker import SimBroker
from controller.sim.checks import Oracle
from controller.sim.store import SimStore
from controller.sim.world import Node, World

DRILL_AFTER_MS = 1000


@dataclass
class Cast:
    store: SimStore
    brokers: list[SimBroker]
    controllers: list[SimController]
    min_in_sync: int


@dataclass
class Nemesis:
    world: World
    cast: Cast
    oracle: Oracle
    bound_ms: int
    failovers: list[int] = field(default_factory=list)  # drill: master kill -> next confirm
    faults: int = 0
    _drill_ms: int = -1

    # -- storms --

    def storm(self, start_ms: int, end_ms: int) -> None:
        rng, world = self.world.rng, self.world
        world.at_time(start_ms, self._weather)
        at = start_ms
        while True:
            at += rng.randint(100, 1000)
            if at >= end_ms:
                return
            world.at_time(at, self._fault)

    def _weather(self) -> None:
        rng, world = self.world.rng, self.world
        world.drop = rng.choice((0.0, 0.01, 0.05, 0.2))
        world.dup = rng.choice((0.0, 0.01, 0.05))
        world.slow = rng.choice((0.0, 0.02, 0.1))

    def _fault(self) -> None:
        rng, cast = self.world.rng, self.cast
        self.faults += 1
        kind = rng.choices(
            ("broker", "restart", "controller", "store", "cut", "heal"), (3, 3, 2, 1, 3, 2)
        )[0]
        if kind == "broker":
            self._crash(self._master() if rng.random() < 0.5 else rng.choice(cast.brokers))
        elif kind == "controller":
            leader = [c for c in cast.controllers if c.state.leader is not None]
            self._crash(
                leader[0] if leader and rng.random() < 0.5 else rng.choice(cast.controllers)
            )
        elif kind == "restart":
            down = [n for n in self._processes() if not n.up]
            if down:
                rng.choice(down).start()
        elif kind == "store" and cast.store.up:
            cast.store.crash()
            self.world.after(rng.randint(100, 1500), self._restart, cast.store)
        elif kind == "cut":
            self._cut()
        elif kind == "heal":
            self.world.heal()

    def _cut(self) -> None:
        rng, cast = self.world.rng, self.cast
        master = self._master()
        if master is not None and rng.random() < 0.33:
            self.world.partition({master.name}, {cast.store.name, *self._names(cast.controllers)})
            return
        names = sorted(self.world.nodes)
        node = rng.choice(names)
        others = {n for n in names if n != node and rng.random() < 0.5}
        self.world.partition({node}, others)

    # -- calm windows --

    def calm(self, start_ms: int) -> None:
        self.world.at_time(start_ms, self._calm)

    def _calm(self) -> None:
        rng, world, cast = self.world.rng, self.world, self.cast
        world.drop = world.dup = world.slow = 0.0
        world.heal()
        self._restart(cast.store)
        if not any(c.up for c in cast.controllers):
            self._restart(rng.choice(cast.controllers))
        for broker in cast.brokers:
            if not broker.up and rng.random() < 0.5:
                broker.start()
        self._drill_ms = -1
        if rng.random() < 0.5:
            world.after(DRILL_AFTER_MS, self._drill)
        check_at = world.now + DRILL_AFTER_MS + self.bound_ms
        world.at_time(check_at, self._check_liveness, world.now)

    def _drill(self) -> None:
        master = self._master()
        if master is not None:
            master.crash()
            self._drill_ms = self.world.now

    def _check_liveness(self, calm_since_ms: int) -> None:
        since = max(calm_since_ms, self._drill_ms)
        last = self.oracle.last_client_confirm_ms
        if self._drill_ms >= 0 and last > self._drill_ms:
            self.failovers.append(self.oracle.first_confirm_after(self._drill_ms) - self._drill_ms)
        if not self._healthy() or last > since:
            return
        self.oracle.fail(
            "failover-within-bound",
            f"no confirm in the {self.world.now - since} ms since t={since} ms "
            f"(bound {self.bound_ms} ms) with a healthy quorum",
        )

    def _healthy(self) -> bool:
        up = [b for b in self.cast.brokers if b.up]
        in_sync = self.oracle.record.in_sync
        return any(b.name in in_sync for b in up) and len(up) >= self.cast.min_in_sync

    # -- helpers --

    def _master(self) -> SimBroker | None:
        masters = [b for b in self.cast.brokers if b.can_confirm()]
        return masters[0] if masters else None

    def _crash(self, node: Node | None) -> None:
        if node is not None and node.up:
            node.crash()

    def _restart(self, node: Node) -> None:
        if not node.up:
            node.start()

    def _processes(self) -> list[Node]:
        return [*self.cast.brokers, *self.cast.controllers]

    @staticmethod
    def _names(nodes: list[SimController]) -> set[str]:
        return {n.name for n in nodes}
