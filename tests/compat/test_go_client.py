"""Go's amqp091-go (Debian's golang-github-rabbitmq-amqp091-go-dev, installed by
scripts/setup-dev) against a real gateway: confirms, manual acks, header types, direct reply-to.

The program is tests/compat/go/client.go, built offline in GOPATH mode from Debian's sources.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.compat.client_programs import ALL_HEADERS, MESSAGES, build, check_outcome, run_client
from tests.harness.processes import GatewayProcess

GO_DIR = Path(__file__).parent / "go"
GOPATH = Path("/usr/share/gocode")
N = MESSAGES


@pytest.fixture(scope="module")
def go_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("go")
    env = {
        **os.environ,
        "GO111MODULE": "off",  # no module download: the library comes from GOPATH
        "GOPATH": str(GOPATH),
        "GOCACHE": str(out / "cache"),
    }
    build(
        ["go", "build", "-o", str(out / "client"), "client.go"],
        needs=[GOPATH / "src/github.com/rabbitmq/amqp091-go"],
        cwd=GO_DIR,
        env=env,
        timeout_s=300,
    )
    return out / "client"


def test_go_client_confirms_acks_and_direct_reply_to(
    gateway: GatewayProcess, go_client: Path
) -> None:
    check_outcome(run_client([str(go_client), gateway.url, str(N)]), ALL_HEADERS)
