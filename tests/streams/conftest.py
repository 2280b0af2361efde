"""One gateway (admin API on) for the stream, reset and dead-letter tests of this folder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.servers import free_port
from tests.harness.processes import GatewayProcess


@pytest.fixture
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    data = tmp_path_factory.mktemp("gateway") / "data"
    process = GatewayProcess(data, ["--admin-port", str(free_port())]).start()
    yield process
    process.stop()
