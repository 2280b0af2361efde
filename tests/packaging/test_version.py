"""`mqgw --version` and the gateway's start say whether the compiled hot paths are in use.

The development virtualenv (scripts/setup) runs them; MQGW_PURE_PYTHON=1 disables them, and
both say so.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

from storage import twins
from tests.harness.processes import GatewayProcess

MQGW = Path(sys.executable).parent / "mqgw"


def version(**env: str) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k != twins.PURE_ENV}
    asked = subprocess.run(
        [MQGW, "--version"], env={**base, **env}, capture_output=True, text=True, timeout=60
    )
    assert asked.returncode == 0, asked.stderr
    assert asked.stderr == ""
    return asked.stdout.splitlines()


def test_the_development_install_runs_the_compiled_hot_paths() -> None:
    assert version() == [f"mqgw {importlib.metadata.version('mqgw')}", "compiled hot paths: yes"]


def test_mqgw_pure_python_disables_them_and_version_says_so() -> None:
    assert version(MQGW_PURE_PYTHON="1")[1:] == [
        "compiled hot paths: no (disabled by MQGW_PURE_PYTHON=1)"
    ]


def test_status_names_the_import_error_of_a_twin_that_will_not_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(twins.PURE_ENV, raising=False)
    assert twins.status() == (True, "")
    hot = {"publish_cut": "gateway.amqp.publish_cut", "no_such_twin": "gateway.amqp.no_such_twin"}
    monkeypatch.setattr(twins, "HOT_MODULES", hot)
    compiled, reason = twins.status()
    assert not compiled
    assert reason == "mqgw_speedups.no_such_twin: No module named 'mqgw_speedups.no_such_twin'"


@pytest.mark.parametrize("pure", ["", "1"])
def test_the_gateway_logs_the_line_once_at_start(tmp_path: Path, pure: str) -> None:
    gateway = GatewayProcess(tmp_path / "data", env={twins.PURE_ENV: pure}).start()
    try:
        logged = [line for line in gateway.log_lines if "compiled hot paths" in line]
    finally:
        gateway.stop()
    expected = "no (disabled by MQGW_PURE_PYTHON=1)" if pure else "yes"
    assert len(logged) == 1, gateway.log_lines
    assert logged[0].rstrip().endswith(f"mqgw.server: compiled hot paths: {expected}")
