"""Which partitions move between broker groups (gateway/vhost/group_plans.py)."""

from __future__ import annotations

from gateway.vhost.group_plans import PartitionLoad, plan_drain, plan_rebalance, shares, spread


def load(queue: str, group: str, weight: int, partition: int = 0, fixed: str | None = None,
         allowed: tuple[str, ...] = ()) -> PartitionLoad:  # fmt: skip
    return PartitionLoad("/", queue, partition, group, weight, fixed, allowed)


def test_rebalance_fills_a_new_group_until_every_share_is_near_even() -> None:
    loads = [load(f"q{n}", "g1" if n % 2 else "g2", 10) for n in range(12)]
    moves = plan_rebalance(loads, ["g1", "g2", "g3"], tolerance=0.1)
    assert {m.target for m in moves} == {"g3"} and len(moves) == 4
    after = shares(loads, ["g1", "g2", "g3"])
    for move in moves:
        after[move.source] -= move.weight
        after[move.target] += move.weight
    assert after == {"g1": 40, "g2": 40, "g3": 40} and spread(after) == 0


def test_rebalance_moves_the_partition_that_closes_the_gap_best() -> None:
    loads = [load("hot", "g1", 90), load("warm", "g1", 40), load("cold", "g2", 10)]
    (move,) = plan_rebalance(loads, ["g1", "g2"], tolerance=0.1)
    assert (move.queue, move.source, move.target) == ("warm", "g1", "g2")


def test_fixed_and_pinned_partitions_stay() -> None:
    loads = [load("stream", "g1", 50, fixed="a stream queue keeps its partitions"),
             load("pinned", "g1", 50, allowed=("g1", "g2")), load("free", "g1", 50)]  # fmt: skip
    moves = plan_rebalance(loads, ["g1", "g2", "g3"], tolerance=0.1)
    # free goes to g2; then g3 is the lightest, and neither the pin nor the stream allows it
    assert [(m.queue, m.target) for m in moves] == [("free", "g2")]
    drained, stuck = plan_drain(loads, "g1", ["g2", "g3"])
    assert [s.queue for s in stuck] == ["stream"]
    assert {(m.queue, m.target) for m in drained} == {("pinned", "g2"), ("free", "g3")}


def test_one_group_or_an_even_cluster_plans_nothing() -> None:
    assert plan_rebalance([load("q", "g1", 5)], ["g1"]) == []
    even = [load("a", "g1", 5), load("b", "g2", 5)]
    assert plan_rebalance(even, ["g1", "g2"]) == []
