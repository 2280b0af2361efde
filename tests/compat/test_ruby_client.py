"""Ruby's bunny (Debian's ruby-bunny, installed by scripts/setup-dev) against a real gateway:
confirms, manual acks, header types, direct reply-to.

The program is tests/compat/ruby/client.rb.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.compat.client_programs import MESSAGES, check_outcome, run_client
from tests.harness.processes import GatewayProcess

RUBY_DIR = Path(__file__).parent / "ruby"
N = MESSAGES
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
    check_outcome(
        run_client(["ruby", str(RUBY_DIR / "client.rb"), gateway.url, str(N)]), EXPECTED_HEADERS
    )
