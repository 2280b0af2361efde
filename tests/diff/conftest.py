"""Fixtures for differential tests: one RabbitMQ node and one gateway for the whole session.

Scenarios isolate themselves by unique queue/exchange names (``names``), so sharing the two
servers is safe and keeps the run short (RabbitMQ takes seconds to boot).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from bench.servers import free_port
from tests.diff.support import Server
from tests.harness.processes import GatewayProcess
from tests.harness.rabbitmq import RabbitMQProcess

_counter = itertools.count(1)


@pytest.fixture(scope="session")
def rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitMQProcess]:
    """A private RabbitMQ node; failing to start it fails the tests (no skip)."""
    process = RabbitMQProcess(tmp_path_factory.mktemp("rabbitmq")).start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def diff_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    # The admin API is on (policies are set through it).
    admin = ["--admin-port", str(free_port())]
    process = GatewayProcess(tmp_path_factory.mktemp("gateway") / "data", admin).start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def servers(rabbitmq: RabbitMQProcess, diff_gateway: GatewayProcess) -> list[Server]:
    """RabbitMQ first: its outcome is the expectation the gateway is compared with."""
    return [
        Server("rabbitmq", rabbitmq.amqp_port),
        Server("gateway", diff_gateway.amqp_port),
    ]


@pytest.fixture
def names(request: pytest.FixtureRequest) -> str:
    """A prefix unique to this test, the same on both servers (so texts compare equal)."""
    return f"d{next(_counter)}"
