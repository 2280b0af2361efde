"""The nemesis's schedule (localcluster/nemesis/plan.py): replayable from its seed, every
kind of fault, every split of the hosts over a long enough run, pauses longer than leases,
kills only where a process restarts, and one fault at a time with a healed gap between."""

from __future__ import annotations

import itertools

import pytest

from localcluster.nemesis.plan import KINDS, plan, splits

HOSTS = ["redis-a", "redis-b", "ctl1", "ctl2", "b0", "b1", "b2", "gw1", "gw2"]
RESTARTABLE = ["b0", "b1", "b2", "gw1", "gw2", "ctl1", "ctl2"]
REDIS = ["redis-a", "redis-b"]


def test_the_same_seed_gives_the_same_run_and_another_seed_another() -> None:
    one = plan(7, HOSTS, 10, restartable=RESTARTABLE)
    assert one == plan(7, HOSTS, 10, restartable=RESTARTABLE)
    assert one != plan(8, HOSTS, 10, restartable=RESTARTABLE)
    assert [f.describe() for f in one] == [
        f.describe() for f in plan(7, HOSTS, 10, restartable=RESTARTABLE)
    ]


def test_faults_come_one_at_a_time_within_the_run() -> None:
    faults = plan(3, HOSTS, 10, restartable=RESTARTABLE, coordinator=REDIS, gap_s=(3, 10))
    assert len(faults) > 10
    for before, after in itertools.pairwise(faults):
        assert after.at_s >= before.at_s + before.lasts_s + 3 - 0.01  # healed gap between
    assert faults[-1].at_s + faults[-1].lasts_s <= 600
    assert {f.kind for f in faults} == set(KINDS)


def test_each_fault_names_hosts_that_make_sense() -> None:
    for fault in plan(11, HOSTS, 60, restartable=RESTARTABLE, coordinator=REDIS, pause_min_s=6):
        named = [h for side in fault.hosts for h in side]
        assert set(named) <= set(HOSTS)
        if fault.kind == "halves":
            left, right = fault.hosts
            assert left and right and not set(left) & set(right)
            assert set(left) | set(right) == set(HOSTS)
        elif fault.kind == "bridge":
            assert len(set(named)) == 3
        elif fault.kind == "kill":
            assert named[0] in RESTARTABLE
        elif fault.kind == "pause":
            assert fault.lasts_s >= 6
        elif fault.kind == "coordinator":
            assert fault.hosts == (tuple(REDIS),)
        elif fault.kind == "lossy":
            assert len(named) == 1 and 0.05 <= fault.loss <= 0.4
            assert f"{fault.loss:.0%} lost" in fault.describe()
        if fault.kind != "lossy":
            assert fault.loss == 0.0


def test_every_split_is_met_in_a_long_enough_run() -> None:
    hosts = ["a", "b", "c", "d", "e"]
    every = splits(hosts)
    assert len(every) == 2 ** (len(hosts) - 1) - 1
    assert len({frozenset(map(frozenset, s)) for s in every}) == len(every)
    met = {fault.hosts for fault in plan(5, hosts, 300) if fault.kind == "halves"}
    assert met == set(every)


def test_no_kill_without_a_restartable_host_and_bad_hosts_refused() -> None:
    assert not {"kill", "coordinator"} & {f.kind for f in plan(1, HOSTS, 30)}
    with pytest.raises(ValueError, match="three distinct"):
        plan(1, ["a", "b"], 1)
    with pytest.raises(ValueError, match="must be among the hosts"):
        plan(1, HOSTS, 1, restartable=["elsewhere"])
