"""The failover simulation: seeds pass, replay exactly, and the invariants catch the bugs
they are there for (each safety mechanism, broken on purpose, is caught within few seeds)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace

import pytest

from controller.sim import DEFAULT_STEPS
from controller.sim import run as sim_run
from controller.sim.broker import SimBroker
from controller.sim.run import SeedResult, default_jobs, run_seed, run_seeds
from tests.harness.processes import REPO

# Seeds that failed once, with what they found (docs/controller.md, "Bugs the simulation
# found"). Seeds replay the current code, so they guard the area rather than the exact path.
REGRESSIONS = [
    (386, "decide kept one lag report per group: an old master's stale one hid the expansion"),
    (369, "same bug: no confirm within the bound with min in-sync 2"),
    (1643, "a new master let a replica join on its own confirm offset, below its epoch start"),
    (2340, "sim: entries that survived a crash were not durable, a 2nd crash dropped them"),
]


def test_200_seeds() -> None:
    results = list(run_seeds(range(200), DEFAULT_STEPS, jobs=default_jobs()))
    failed = [r.failure for r in results if not r.ok]
    assert failed == []
    # The runs do what they are for: elections, confirms, reads, failover drills.
    assert sum(r.elections for r in results) > 400
    assert sum(r.acked for r in results) > 200 * 200
    assert sum(len(r.failovers) for r in results) > 100


@pytest.mark.parametrize(("seed", "found"), REGRESSIONS, ids=[str(s) for s, _ in REGRESSIONS])
def test_regression_seeds(seed: int, found: str) -> None:
    assert run_seed(seed).failure == ""


def _trace(seed: int, steps: int) -> str:
    """The trace ends with every broker's log, the history and the next random draw."""
    trace: list[str] = []
    run_seed(seed, steps, trace)
    assert len(trace) > 10
    return hashlib.sha256("\n".join(trace).encode()).hexdigest()


def test_a_seed_replays_exactly() -> None:
    assert _trace(7, 3000) == _trace(7, 3000)
    assert _trace(7, 3000) != _trace(8, 3000)


def test_a_seed_replays_exactly_whatever_the_string_hash_seed() -> None:
    """Sets of names are never iterated where it matters: another process, another hash
    seed, the same run."""
    code = "from tests.controller.test_sim import _trace; print(_trace(11, 3000))"
    digests = {
        subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
            env={"PYTHONHASHSEED": str(hash_seed), "PATH": "/usr/bin:/bin"},
        ).stdout.strip()
        for hash_seed in (1, 2, 3)
    }  # fmt: skip
    assert len(digests) == 1


def test_the_reproducer_command_replays_a_seed() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mqgw_cli.main", "sim", "failover", "--seed", "5", "--steps",
         "2000", "--jobs", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "1 seeds, 0 failed" in result.stdout
    assert "seeds/min" in result.stdout


def _first_failure(seeds: int) -> SeedResult | None:
    for seed in range(seeds):
        result = run_seed(seed)
        if not result.ok:
            return result
    return None


@pytest.fixture
def broken(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    yield monkeypatch


def test_caught_an_election_before_the_old_master_stopped(broken: pytest.MonkeyPatch) -> None:
    """Election silence shorter than the master's own timeout: two masters can confirm."""
    broken.setattr(type(sim_run.SIM_CONFIG), "check", lambda self: self)
    broken.setattr(sim_run, "SIM_CONFIG", replace(sim_run.SIM_CONFIG, safety_margin_ms=-300))
    failure = _first_failure(100)
    assert failure is not None and failure.invariant == "one-master-confirming"


def test_caught_a_master_that_does_not_resign_after_a_restart(
    broken: pytest.MonkeyPatch,
) -> None:
    """A master back from a crash goes on at its epoch: the same offset, two entries."""
    start = SimBroker.on_start

    def forgetful(broker: SimBroker) -> None:
        start(broker)
        broker.resigned_epoch = 0

    broken.setattr(SimBroker, "on_start", forgetful)
    failure = _first_failure(200)
    assert failure is not None
    assert failure.invariant in {"one-confirmed-prefix", "one-master-confirming"}


def test_caught_an_unclean_election(broken: pytest.MonkeyPatch) -> None:
    broken.setattr(sim_run, "SIM_CONFIG", replace(sim_run.SIM_CONFIG, unclean_election=True))
    failure = _first_failure(100)
    assert failure is not None and failure.invariant == "no-confirmed-write-lost"


@pytest.mark.slow
def test_10000_seeds() -> None:
    """CI's slow tier: `mqgw sim failover --seeds 10000` (about 3 minutes on 2 CPUs)."""
    failed = [
        r.failure for r in run_seeds(range(10_000), DEFAULT_STEPS, jobs=default_jobs()) if not r.ok
    ]
    assert failed == []
