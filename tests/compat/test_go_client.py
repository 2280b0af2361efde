"""Go's amqp091-go (Debian's golang-github-rabbitmq-amqp091-go-dev, installed by
scripts/setup-dev) against a real gateway: confirms, manual acks, header types, direct reply-to.

The program is tests/compat/go/client.go, built offline in GOPATH mode from Debian's sources.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.compat.client_programs import MESSAGES, check_outcome, run_client
from tests.harness.processes import GatewayProcess

GO_DIR = Path(__file__).parent / "go"
GOPATH = Path("/usr/share/gocode")
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
def go_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    library = GOPATH / "src/github.com/rabbitmq/amqp091-go"
    assert shutil.which("go") and library.is_dir(), "run scripts/setup-dev first"
    build = tmp_path_factory.mktemp("go")
    env = {
        **os.environ,
        "GO111MODULE": "off",  # no module download: the library comes from GOPATH
        "GOPATH": str(GOPATH),
        "GOCACHE": str(build / "cache"),
    }
    subprocess.run(
        ["go", "build", "-o", str(build / "client"), "client.go"],
        cwd=GO_DIR,
        env=env,
        check=True,
        timeout=300,
    )
    return build / "client"


def test_go_client_confirms_acks_and_direct_reply_to(
    gateway: GatewayProcess, go_client: Path
) -> None:
    check_outcome(run_client([str(go_client), gateway.url, str(N)]), EXPECTED_HEADERS)
