"""Ruby's bunny (Debian's ruby-bunny, installed by scripts/setup-dev) against a real gateway:
confirms, manual acks, header types, direct reply-to.

The program is tests/compat/ruby/client.rb.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.harness.processes import GatewayProcess, die_with_parent

RUBY_DIR = Path(__file__).parent / "ruby"
N = 20
# Headers of the first message as the program prints them (every message carries these plus
# its index "i"): timestamps in seconds. bunny sends no byte array and, through its
# amq-protocol bugs, no decimal and no array ending in a short element (see client.rb).
EXPECTED_HEADERS = {
    "str": "héllo ✓",
    "i64": 1 << 40,
    "bool": True,
    "dbl": 2.5,
    "table": {"k": "v", "n": 7},
    "array": [False, 1, "two"],
    "ts": 1700000000,
}


def test_ruby_client_confirms_acks_and_direct_reply_to(gateway: GatewayProcess) -> None:
    assert shutil.which("ruby"), "run scripts/setup-dev first"
    result = subprocess.run(
        ["ruby", str(RUBY_DIR / "client.rb"), gateway.url, str(N)],
        capture_output=True,
        encoding="utf-8",
        timeout=60,
        preexec_fn=die_with_parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["problems"] == []
    assert outcome["confirmed"] == N
    assert outcome["received"] == [f"m{i}" for i in range(N)]
    assert outcome["headers"] == EXPECTED_HEADERS
    assert (outcome["content_type"], outcome["delivery_mode"]) == ("text/plain", 2)
    assert outcome["remaining"] == 0
    assert outcome["rpc"] == {f"c{k}": f"reply:req{k}" for k in range(3)}
