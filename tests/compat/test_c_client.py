"""rabbitmq-c (Debian's librabbitmq-dev, installed by scripts/setup-dev) against a real gateway:
confirms, manual acks, header types, direct reply-to.

The program is tests/compat/c/client.c, compiled with gcc for the test run.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.compat.client_programs import MESSAGES, check_outcome, run_client
from tests.harness.processes import GatewayProcess

C_DIR = Path(__file__).parent / "c"
N = MESSAGES
# Headers of the first message as the program prints them (every message carries these plus
# its index "i"): timestamps in seconds, bytes in hex, decimals as text.
EXPECTED_HEADERS = {
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


@pytest.fixture(scope="module")
def c_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    assert shutil.which("gcc") and Path("/usr/include/amqp.h").is_file(), (
        "run scripts/setup-dev first"
    )
    binary = tmp_path_factory.mktemp("c") / "client"
    subprocess.run(
        ["gcc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1",
         "-o", str(binary), str(C_DIR / "client.c"), "-lrabbitmq"],
        check=True,
        timeout=120,
    )  # fmt: skip
    return binary


def test_c_client_confirms_acks_and_direct_reply_to(
    gateway: GatewayProcess, c_client: Path
) -> None:
    check_outcome(run_client([str(c_client), gateway.url, str(N)]), EXPECTED_HEADERS)
