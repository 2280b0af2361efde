"""Servers for the observability tests: a RabbitMQ 3.10 node with tracing on for "/" (the
firehose's reference), and gateways with the admin API on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.rabbitmq_node import RabbitMQProcess
from bench.servers import GatewayServer, free_port


@pytest.fixture(scope="session")
def traced_rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitMQProcess]:
    """`rabbitmqctl trace_on -p /` on a private node; failing to start fails (no skip)."""
    process = RabbitMQProcess(tmp_path_factory.mktemp("rabbitmq")).start()
    try:
        process.ctl("trace_on", "-p", "/")
        yield process
    finally:
        process.stop()


def start_gateway(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> GatewayServer:
    return GatewayServer(data_dir, ["--admin-port", str(free_port()), *args], env=env).start()


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayServer]:
    """A gateway (embedded node) with its admin API; tracing off until a test turns it on."""
    process = start_gateway(tmp_path / "data")
    yield process
    process.stop()
