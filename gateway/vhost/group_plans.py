"""Which partitions to move between broker groups (docs/elastic-queues.md): to drain a
group, or to give every group a fair share of the traffic. Pure: the loads come in, the
moves go out (gateway/vhost/group_moves.py carries them out).

A partition's weight is what it costs its group: the messages published to it during the
measuring window plus its backlog (ready messages), and at least 1, so idle partitions
still spread by count. A group's share is the sum of its partitions' weights.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PartitionLoad:
    vhost: str
    queue: str
    partition: int
    group: str
    weight: int
    # Why it cannot move (a queue kind that keeps its partitions, a pin), or None.
    fixed: str | None = None
    allowed: tuple[str, ...] = ()  # the groups its queue may use (); () = any


@dataclass(frozen=True)
class Move:
    vhost: str
    queue: str
    partition: int
    source: str
    target: str
    weight: int


def shares(loads: Iterable[PartitionLoad], groups: Iterable[str]) -> dict[str, int]:
    totals = dict.fromkeys(groups, 0)
    for load in loads:
        totals[load.group] = totals.get(load.group, 0) + load.weight
    return totals


def _may_go(load: PartitionLoad, group: str) -> bool:
    return load.fixed is None and (not load.allowed or group in load.allowed)


def plan_drain(
    loads: Sequence[PartitionLoad], group: str, others: Sequence[str]
) -> tuple[list[Move], list[PartitionLoad]]:
    """Every partition on ``group`` to the other groups, heaviest first, each to the one
    with the smallest share it may go to; and those that cannot move (with why)."""
    totals = shares((x for x in loads if x.group != group), others)
    moves: list[Move] = []
    stuck: list[PartitionLoad] = []
    for load in sorted((x for x in loads if x.group == group), key=lambda x: -x.weight):
        choices = [g for g in others if _may_go(load, g)]
        if not choices:
            stuck.append(load)
            continue
        target = min(choices, key=lambda g: (totals[g], g))
        totals[target] += load.weight
        moves.append(Move(load.vhost, load.queue, load.partition, group, target, load.weight))
    return moves, stuck


def plan_rebalance(
    loads: Sequence[PartitionLoad], groups: Sequence[str], tolerance: float = 0.1,
    max_moves: int = 1000,
) -> list[Move]:  # fmt: skip
    """Moves from the group with the largest share to the one with the smallest, each the
    partition that brings the two closest together, until every share is within
    ``tolerance`` of even (or no move helps)."""
    if len(groups) < 2:
        return []
    totals = shares(loads, groups)
    on: dict[str, list[PartitionLoad]] = defaultdict(list)
    for load in loads:
        on[load.group].append(load)
    even = sum(totals.values()) / len(groups)
    moves: list[Move] = []
    while len(moves) < max_moves:
        heavy = max(groups, key=lambda g: (totals[g], g))
        light = min(groups, key=lambda g: (totals[g], g))
        if totals[heavy] <= even * (1 + tolerance) and totals[light] >= even * (1 - tolerance):
            break
        gap = totals[heavy] - totals[light]
        helpful = [x for x in on[heavy] if _may_go(x, light) and x.weight < gap]
        if not helpful:
            break
        best = min(helpful, key=lambda x: (abs(gap - 2 * x.weight), x.queue, x.partition))
        on[heavy].remove(best)
        moved = PartitionLoad(best.vhost, best.queue, -1, light, best.weight, "moved by this plan")
        on[light].append(moved)  # its new partition: counted there, not moved again
        totals[heavy] -= best.weight
        totals[light] += best.weight
        moves.append(Move(best.vhost, best.queue, best.partition, heavy, light, best.weight))
    return moves


def spread(totals: Mapping[str, int]) -> float:
    """How far the largest share is above even (0.2: 20 %)."""
    if not totals:
        return 0.0
    even = sum(totals.values()) / len(totals)
    return 0.0 if even == 0 else max(totals.values()) / even - 1
