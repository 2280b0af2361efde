"""`mqgw bench store` as a user runs it: each append run's JSON line reads back every record
it appended (the run asserts it), and gives CPU per 100k records and the encoder that ran,
which MQGW_PURE_PYTHON chooses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from storage import twins
from tests.harness.processes import REPO


@pytest.mark.parametrize(("pure", "encoder"), [("1", "pure"), ("", "compiled")])
def test_append_runs_say_their_cpu_per_record_and_encoder(
    tmp_path: Path, pure: str, encoder: str
) -> None:
    out = tmp_path / "runs.jsonl"
    env = {k: v for k, v in os.environ.items() if k != twins.PURE_ENV}
    env |= {twins.PURE_ENV: pure, "COLUMNS": "200"}  # the table unwrapped
    command = [sys.executable, "-m", "mqgw_cli.main", "bench", "store", "--quick"]
    command += ["--seconds", "0.2", "--backlog", "0", "--data-dir", str(tmp_path / "d")]
    done = subprocess.run(
        [*command, "--json", str(out)], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    runs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(runs) == 8  # 100 B: async and sync, batches 1, 64, 512 and a fan-out of 10
    for run in runs:
        assert run["records"] > 0
        assert run["encoder"] == encoder
        # Appending costs CPU, and far less than a second per record.
        assert 0 < run["cpu_s_per_100k"] < 100_000, run
    assert "CPU s/100k" in done.stderr  # the summary table's column
