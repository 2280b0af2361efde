from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.processes import GatewayProcess
from tests.harness.rocketmq import rocketmq  # noqa: F401 (the session fixture, for all tests)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    """A real gateway process (embedded node) on free loopback ports, stopped afterwards."""
    process = GatewayProcess(tmp_path / "data").start()
    yield process
    process.stop()
