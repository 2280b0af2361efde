"""The nemesis run on real hosts (localcluster/nemesis/run.py): ten network namespaces, the
replicated cluster over Redis Sentinel, clients through both gateways, the faults of one seed,
then the checker. The default tier runs seed 1 for one minute (about two and a half with the
start and the drain); the slow tier takes the seed and length from MQGW_NEMESIS_SEED and
MQGW_NEMESIS_MINUTES (default seed 1, 2 minutes). A failure prints the seed, the fault
timeline and the messages concerned."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localcluster.nemesis.run import run


def test_a_short_nemesis_run_loses_nothing(tmp_path: Path) -> None:
    _loses_nothing(1, 1.0, tmp_path)


@pytest.mark.slow
def test_a_nemesis_run_loses_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get("MQGW_NEMESIS_SEED", "1"))
    minutes = float(os.environ.get("MQGW_NEMESIS_MINUTES", "2"))
    _loses_nothing(seed, minutes, tmp_path)


def _loses_nothing(seed: int, minutes: float, tmp_path: Path) -> None:
    report = run(seed, minutes, tmp_path)
    assert report.verdict is not None
    assert report.verdict.confirmed > 1000, report.describe()  # the workload really ran
    assert report.faults, report.describe()
    assert report.ok, f"{report.describe()}\nlogs: {tmp_path / 'logs'}"
