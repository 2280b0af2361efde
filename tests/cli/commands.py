"""The operator commands run as users run them: the real CLI in a subprocess, with an
environment that holds no MQGW_* variable and a HOME of the test's own (so that neither the
developer's settings nor a credentials file in their ~/.config takes part)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.harness.processes import REPO


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MQGW_")}
    env.pop("XDG_CONFIG_HOME", None)
    return {**env, "HOME": str(home), **extra}


def mqgw(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqgw_cli.main", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
