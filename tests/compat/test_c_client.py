"""rabbitmq-c (Debian's librabbitmq-dev, installed by scripts/setup-dev) against a real gateway:
confirms, manual acks, header types, direct reply-to.

The program is tests/compat/c/client.c, compiled with gcc for the test run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness.processes import GatewayProcess, die_with_parent

C_DIR = Path(__file__).parent / "c"
N = 20
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
    result = subprocess.run(
        [str(c_client), gateway.url, str(N)],
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
