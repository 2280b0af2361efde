"""The simulated world: one seeded random source, one event queue, clocks and a faulty network.

Time is an integer of simulated ms. Nothing here reads a real clock, and every choice comes
from ``World.rng``, so a seed replays exactly (sets are never iterated where the order could
change what happens: string hashing differs between processes).

- A node's clock runs at its own rate (1 +- ``drift``) from an arbitrary offset, both drawn
  again when it restarts, as a monotonic clock after a reboot. Timers are set in local ms.
- A message is dropped (``drop``), delayed (a few ms, sometimes ``slow_ms``; so messages
  overtake each other), duplicated (``dup``), or lost to a partition: a cut between two nodes
  drops what is sent across it and what was in flight when it was made. A message for a
  node that restarted since it was addressed (``to_inc``) is dropped, like a reply on a
  closed connection.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from typing import Any


class Node:
    """A process: up or down, with an incarnation number and a local clock."""

    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name
        self.up = False
        self.incarnation = 0
        self._rate = 1.0
        self._offset = 0
        self._started_at = 0
        world.nodes[name] = self

    def now(self) -> int:
        """The local clock, in ms."""
        return self._offset + int((self.world.now - self._started_at) * self._rate)

    def to_global(self, local_ms: int) -> float:
        return self._started_at + (local_ms - self._offset) / self._rate

    def start(self) -> None:
        self.world.note(f"{self.name} starts")
        rng = self.world.rng
        self.up = True
        self.incarnation += 1
        self._rate = 1.0 + rng.uniform(-self.world.drift, self.world.drift)
        self._offset = rng.randrange(1_000_000)
        self._started_at = self.world.now
        self.on_start()

    def crash(self) -> None:
        self.world.note(f"{self.name} crashes")
        self.up = False
        self.on_crash()

    def timer(self, local_ms: int, action: Callable[..., None], *args: Any) -> None:
        delay = max(1, int(local_ms / self._rate) + 1)
        self.world.after(delay, self._fire, self.incarnation, action, args)

    def _fire(self, incarnation: int, action: Callable[..., None], args: tuple[Any, ...]) -> None:
        if self.up and incarnation == self.incarnation:
            action(*args)

    def send(self, dst: str, message: Any, to_inc: int | None = None) -> None:
        self.world.send(self.name, dst, message, to_inc)

    # -- what a node does --
    def on_start(self) -> None: ...
    def on_crash(self) -> None: ...
    def receive(self, src: str, message: Any) -> None: ...


class World:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.now = 0
        self.steps = 0
        self.nodes: dict[str, Node] = {}
        self._queue: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0
        self.cut: set[tuple[str, str]] = set()
        self.drop = 0.0
        self.dup = 0.0
        self.slow = 0.0  # probability of a slow message
        self.slow_ms = 300
        self.drift = 0.01
        self.trace: list[str] | None = None  # set to a list to record what happens

    def note(self, text: str) -> None:
        if self.trace is not None:
            self.trace.append(f"{self.now:>7} {text}")

    def after(self, delay_ms: int, action: Callable[..., None], *args: Any) -> None:
        self.at_time(self.now + delay_ms, action, *args)

    def at_time(self, when_ms: int, action: Callable[..., None], *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (max(when_ms, self.now), self._seq, action, args))

    def run_until(self, until_ms: int, max_steps: int) -> bool:
        """Run events up to ``until_ms``; False when ``max_steps`` ran out first."""
        queue = self._queue
        while queue and queue[0][0] <= until_ms:
            if self.steps >= max_steps:
                return False
            when, _, action, args = heapq.heappop(queue)
            self.now = when
            self.steps += 1
            action(*args)
        self.now = max(self.now, until_ms)
        return True

    # -- network --

    def send(self, src: str, dst: str, message: Any, to_inc: int | None) -> None:
        if (src, dst) in self.cut:
            return
        rng = self.rng
        if self.drop and rng.random() < self.drop:
            return
        self.after(self._delay(), self._deliver, src, dst, message, to_inc)
        if self.dup and rng.random() < self.dup:
            self.after(self._delay(), self._deliver, src, dst, message, to_inc)

    def _delay(self) -> int:
        if self.slow and self.rng.random() < self.slow:
            return self.rng.randint(1, self.slow_ms)
        return self.rng.randint(1, 4)

    def _deliver(self, src: str, dst: str, message: Any, to_inc: int | None) -> None:
        node = self.nodes[dst]
        if not node.up or (to_inc is not None and to_inc != node.incarnation):
            return
        if (src, dst) in self.cut:
            return
        node.receive(src, message)

    def partition(self, side: set[str], other: set[str]) -> None:
        self.note(f"cut {sorted(side)} from {sorted(other)}")
        for a in sorted(side):
            for b in sorted(other):
                if a != b:
                    self.cut.add((a, b))
                    self.cut.add((b, a))

    def heal(self) -> None:
        self.note("network healed")
        self.cut.clear()
