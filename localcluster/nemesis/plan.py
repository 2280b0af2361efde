"""The nemesis's schedule from a seed: which fault, on which hosts, when, for how long.

Pure: no clock and no processes, so a failure found by a run is replayed from its seed alone
(the runner applies each fault at its ``at_s`` and heals it ``lasts_s`` later). Kinds:

- ``isolate``: one host sees nobody.
- ``halves``: the hosts split in two sides that do not see each other. Splits are dealt from
  a shuffled deck of every split, so a long enough run meets every combination.
- ``bridge``: A sees B, B sees C, A does not see C (B is the only way between them).
- ``pause``: SIGSTOP, then SIGCONT; longer than every lease and heartbeat (``pause_min_s``).
- ``kill``: SIGKILL, then a restart ``lasts_s`` later (only hosts whose process restarts).
- ``coordinator``: every Redis host killed at once, restarted ``lasts_s`` later (only with
  ``coordinator`` hosts named): clients must go on, nothing may fail over.
- ``lossy``: one host's link loses a share of its packets (``loss``: 5 to 40 %) and carries
  ``LOSSY_KBIT`` each way, queueing the rest (delay under load).

Between two faults everything is healed for a gap, so each fault starts from a whole cluster.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
KINDS = ("isolate", "halves", "bridge", "pause", "kill", "coordinator", "lossy")
LOSSY_KBIT = 1000


@dataclass(frozen=True)
class Fault:
    at_s: float  # from the start of the run
    kind: str
    hosts: tuple[tuple[str, ...], ...]  # isolate/pause/kill: ((h,),); halves: (side, side)
    lasts_s: float
    loss: float = 0.0  # lossy: the share of packets lost

    def describe(self) -> str:
        if self.kind == "lossy":
            what = f"{self.hosts[0][0]} ({self.loss:.0%} lost, {LOSSY_KBIT} kbit/s)"
        elif self.kind == "halves":
            what = " | ".join(",".join(side) for side in self.hosts)
        elif self.kind == "bridge":
            a, b, c = (side[0] for side in self.hosts)
            what = f"{a}-{b}-{c} ({a} and {c} cut)"
        else:
            what = ",".join(self.hosts[0])
        return f"t={self.at_s:7.2f}s {self.kind:7} {what} for {self.lasts_s:.2f}s"


def splits(hosts: Sequence[str]) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """Every way to cut ``hosts`` in two non-empty sides, each once (the side holding the
    first host comes first): 2^(n-1) - 1 of them."""
    first, rest = hosts[0], list(hosts[1:])
    found = []
    for size in range(len(rest)):
        for together in itertools.combinations(rest, size):
            left = (first, *together)
            right = tuple(h for h in rest if h not in together)
            found.append((left, right))
    return found


def _deck(rng: random.Random, cards: Sequence[T]) -> Iterator[T]:
    while True:
        order = list(cards)
        rng.shuffle(order)
        yield from order


def plan(
    seed: int,
    hosts: Sequence[str],
    minutes: float,
    *,
    restartable: Sequence[str] = (),
    coordinator: Sequence[str] = (),
    gap_s: tuple[float, float] = (3.0, 10.0),
    fault_s: tuple[float, float] = (4.0, 20.0),
    pause_min_s: float = 6.0,
) -> list[Fault]:
    """The faults of a run of ``minutes`` over ``hosts``; the same seed, the same list."""
    if len(hosts) < 3 or len(set(hosts)) != len(hosts):
        raise ValueError("a nemesis needs at least three distinct hosts")
    if any(h not in hosts for h in (*restartable, *coordinator)):
        raise ValueError("restartable and coordinator hosts must be among the hosts")
    rng = random.Random(seed)
    kinds = [
        k for k in KINDS if (k != "kill" or restartable) and (k != "coordinator" or coordinator)
    ]
    halves = _deck(rng, splits(hosts))
    faults: list[Fault] = []
    now = rng.uniform(*gap_s)
    end = minutes * 60.0
    while True:
        kind = rng.choice(kinds)
        lasts = rng.uniform(*fault_s)
        if kind == "pause":
            lasts = max(lasts, pause_min_s)
        if now + lasts > end:
            return faults
        chosen: tuple[tuple[str, ...], ...]
        if kind == "halves":
            chosen = next(halves)
        elif kind == "bridge":
            a, b, c = rng.sample(list(hosts), 3)
            chosen = ((a,), (b,), (c,))
        elif kind == "kill":
            chosen = ((rng.choice(list(restartable)),),)
        elif kind == "coordinator":
            chosen = (tuple(coordinator),)
        else:
            chosen = ((rng.choice(list(hosts)),),)
        loss = round(rng.uniform(0.05, 0.4), 2) if kind == "lossy" else 0.0
        faults.append(Fault(round(now, 3), kind, chosen, round(lasts, 3), loss))
        now += lasts + rng.uniform(*gap_s)
