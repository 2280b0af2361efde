"""rabbitmq-c (Debian's librabbitmq-dev, installed by scripts/setup-dev) against a real gateway:
confirms, manual acks, header types, direct reply-to.

The program is tests/compat/c/client.c, compiled with gcc for the test run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.compat.client_programs import ALL_HEADERS, MESSAGES, build, check_outcome, run_client
from tests.harness.processes import GatewayProcess

C_DIR = Path(__file__).parent / "c"
N = MESSAGES


@pytest.fixture(scope="module")
def c_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    binary = tmp_path_factory.mktemp("c") / "client"
    build(
        ["gcc", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1",
         "-o", str(binary), str(C_DIR / "client.c"), "-lrabbitmq"],
        needs=[Path("/usr/include/amqp.h")],
    )  # fmt: skip
    return binary


def test_c_client_confirms_acks_and_direct_reply_to(
    gateway: GatewayProcess, c_client: Path
) -> None:
    check_outcome(run_client([str(c_client), gateway.url, str(N)]), ALL_HEADERS)
