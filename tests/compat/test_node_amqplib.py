"""Node's amqplib (installed by scripts/setup-dev) publishing with confirms and consuming."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.harness.processes import GatewayProcess, die_with_parent

NODE_DIR = Path(__file__).parent / "node"


def test_amqplib_confirm_publish_and_consume(gateway: GatewayProcess) -> None:
    assert (NODE_DIR / "node_modules" / "amqplib").is_dir(), "run scripts/setup-dev first"
    result = subprocess.run(
        ["node", "publish_consume.js", gateway.url, "20"],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=die_with_parent,
    )
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["received"] == [{"body": f"n{i}", "i": i} for i in range(20)]
    assert outcome["messageCount"] == 0
