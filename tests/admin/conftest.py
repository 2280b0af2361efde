"""Fixtures for the management API tests: a gateway with its admin API on, a RabbitMQ node
with the management plugin, and the ``rabbitmqadmin`` script that node serves.

Both servers are shared by the whole package (RabbitMQ takes seconds to boot); tests keep
apart by unique object names.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench.processes import check_for
from bench.rabbitmq_node import RabbitMQProcess
from bench.servers import free_port
from tests.harness.processes import GatewayProcess


@dataclass
class AdminTarget:
    """One server as rabbitmqadmin and HTTP see it."""

    name: str
    admin_port: int
    amqp_port: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def amqp_url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"


@pytest.fixture(scope="session")
def admin_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    data = tmp_path_factory.mktemp("admin-gw") / "data"
    process = GatewayProcess(data, ["--admin-port", str(free_port())]).start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def management_rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitMQProcess]:
    """A private RabbitMQ 3.10 with the management plugin; failing to start fails (no skip)."""
    process = RabbitMQProcess(
        tmp_path_factory.mktemp("rabbitmq-mgmt"), plugins=("rabbitmq_management",)
    ).start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def rabbitmqadmin(
    management_rabbitmq: RabbitMQProcess, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The script the real management plugin serves at /cli/rabbitmqadmin, unchanged."""
    url = f"{management_rabbitmq.management_url}/cli/rabbitmqadmin"

    def download() -> bytes | None:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return bytes(response.read())
        except OSError:
            return None  # the HTTP listener comes up after AMQP

    script = tmp_path_factory.mktemp("cli") / "rabbitmqadmin"
    script.write_bytes(check_for(30, download, interval_s=0.2))
    return script


@pytest.fixture(scope="session")
def targets(
    management_rabbitmq: RabbitMQProcess, admin_gateway: GatewayProcess
) -> list[AdminTarget]:
    """RabbitMQ first: its answers are what the gateway's are compared with."""
    return [
        AdminTarget("rabbitmq", management_rabbitmq.management_port, management_rabbitmq.amqp_port),
        AdminTarget("gateway", admin_gateway.admin_port, admin_gateway.amqp_port),
    ]


def run_admin(script: Path, target: AdminTarget, *args: str, user: str = "guest") -> str:
    """rabbitmqadmin's output (tab-separated, header first); a failure raises with stderr."""
    password = "guest" if user == "guest" else "pw"
    command = [
        sys.executable, str(script), "-H", "127.0.0.1", "-P", str(target.admin_port),
        "-u", user, "-p", password, "-f", "tsv", *args,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise AssertionError(f"{target.name}: rabbitmqadmin {' '.join(args)}: {result.stderr}")
    return result.stdout
