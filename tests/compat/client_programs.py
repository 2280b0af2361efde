"""What every client-language program (tests/compat/<lang>/) is checked for: it ran against
the gateway, printed one JSON line, and that line says confirms, acks, properties, headers and
direct reply-to all came out as RabbitMQ gives them. The compiled ones (C, Go, Java) are built
once per test module with ``build``."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.harness.processes import die_with_parent

MESSAGES = 20  # what each program publishes, confirms and consumes
# Headers of the first message as a program that sends every field type prints them (every
# message carries these plus its index "i"): timestamps in seconds, bytes in hex, decimals as
# text. The C, Go and Java programs send them all.
ALL_HEADERS: Mapping[str, Any] = {
    "str": "héllo ✓",
    "i64": 1 << 40,
    "bool": True,
    "dbl": 2.5,
    "table": {"k": "v", "n": 7},
    "array": [1, "two", False],
    "ts": 1700000000,
    "bytes": "0001ff",
    "dec": "123.45",
}


def build(
    command: Sequence[str],
    needs: Sequence[Path] = (),
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 120,
) -> None:
    """Compile a client program with ``command``; its compiler and the library files it
    ``needs`` come from scripts/setup-dev."""
    missing = [str(path) for path in needs if not path.exists()]
    assert shutil.which(command[0]) and not missing, f"run scripts/setup-dev first ({missing})"
    subprocess.run(
        list(command),
        cwd=cwd,
        env=None if env is None else dict(env),
        check=True,
        timeout=timeout_s,
        preexec_fn=die_with_parent,
    )


def run_client(
    command: Sequence[str], env: Mapping[str, str] | None = None, timeout_s: float = 60
) -> dict[str, Any]:
    result = subprocess.run(
        list(command),
        capture_output=True,
        encoding="utf-8",
        timeout=timeout_s,
        env=None if env is None else dict(env),
        preexec_fn=die_with_parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    outcome: dict[str, Any] = json.loads(result.stdout)
    return outcome


def check_outcome(outcome: Mapping[str, Any], headers: Mapping[str, Any]) -> None:
    assert outcome["problems"] == []
    assert outcome["confirmed"] == MESSAGES
    assert outcome["received"] == [f"m{i}" for i in range(MESSAGES)]
    assert outcome["headers"] == headers
    assert (outcome["content_type"], outcome["delivery_mode"]) == ("text/plain", 2)
    assert outcome["remaining"] == 0
    assert outcome["rpc"] == {f"c{k}": f"reply:req{k}" for k in range(3)}
