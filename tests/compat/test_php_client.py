"""php-amqplib (Debian's php-amqplib with php-cli, installed by scripts/setup-dev) against a real
gateway: confirms, manual acks, header types, direct reply-to.

The program is tests/compat/php/client.php.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.harness.processes import GatewayProcess, die_with_parent

PHP_DIR = Path(__file__).parent / "php"
N = 20
# Headers of the first message as the program prints them (every message carries these plus
# its index "i"): timestamps in seconds, bytes in hex, decimals as text. No double: php-amqplib
# cannot send one.
EXPECTED_HEADERS = {
    "str": "héllo ✓",
    "i64": 1 << 40,
    "bool": True,
    "table": {"k": "v", "n": 7},
    "array": [1, "two", False],
    "ts": 1700000000,
    "bytes": "0001ff",
    "dec": "123.45",
}


def test_php_client_confirms_acks_and_direct_reply_to(gateway: GatewayProcess) -> None:
    assert shutil.which("php") and Path("/usr/share/php/PhpAmqpLib").is_dir(), (
        "run scripts/setup-dev first"
    )
    result = subprocess.run(
        ["php", str(PHP_DIR / "client.php"), gateway.url, str(N)],
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
