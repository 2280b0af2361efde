"""php-amqplib (Debian's php-amqplib with php-cli, installed by scripts/setup-dev) against a real
gateway: confirms, manual acks, header types, direct reply-to.

The program is tests/compat/php/client.php.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.compat.client_programs import MESSAGES, check_outcome, run_client
from tests.harness.processes import GatewayProcess

PHP_DIR = Path(__file__).parent / "php"
N = MESSAGES
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
    check_outcome(
        run_client(["php", str(PHP_DIR / "client.php"), gateway.url, str(N)]), EXPECTED_HEADERS
    )
