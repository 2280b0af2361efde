"""What every client-language program (tests/compat/<lang>/) is checked for: it ran against
the gateway, printed one JSON line, and that line says confirms, acks, properties, headers and
direct reply-to all came out as RabbitMQ gives them."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from tests.harness.processes import die_with_parent

MESSAGES = 20  # what each program publishes, confirms and consumes


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
