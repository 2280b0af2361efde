"""compose/docker-compose.yml as Debian's docker-compose reads it (`docker-compose config`:
no engine needed), and the command lines, healthchecks, volumes and start order in it."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from typing import Any

import pytest
import yaml

from tests.deploy.chart import REPO

COMPOSE = REPO / "compose" / "docker-compose.yml"
DOCKERFILE = REPO / "compose" / "Dockerfile"
META = "redis://redis:6379/0"
BROKERS = {"broker-g1-0": "0", "broker-g1-1": "1"}
CONTROLLERS = ("controller-1", "controller-2")
GATEWAYS = ("gw1", "gw2")


def compose_config(**env: str) -> dict[str, Any]:
    """`docker-compose config`: validates the file and prints it resolved (anchors merged,
    variables interpolated)."""
    done = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config"],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = yaml.safe_load(done.stdout)
    return config


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return compose_config()


def argv(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else list(command)


def test_docker_compose_accepts_the_file_quietly() -> None:
    done = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE), "config", "--quiet"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr


def test_the_topology(config: dict[str, Any]) -> None:
    services = config["services"]
    assert set(services) == {"redis", *BROKERS, *CONTROLLERS, *GATEWAYS}
    assert services["redis"]["image"] == "redis:7"
    images = {services[name]["image"] for name in (*BROKERS, *CONTROLLERS, *GATEWAYS)}
    assert images == {"mqgw:local"}  # one image for every mqgw process
    for name in (*BROKERS, *CONTROLLERS, *GATEWAYS):
        build = services[name]["build"]
        assert build["dockerfile"] == "compose/Dockerfile"
        assert os.path.samefile(build["context"], REPO)
        assert services[name]["restart"] == "unless-stopped"


def test_command_lines(config: dict[str, Any]) -> None:
    services = config["services"]
    for name, broker_id in BROKERS.items():
        # Listens everywhere, registers its own host name (what the others connect to).
        assert services[name]["hostname"] == name
        assert argv(services[name]) == [
            "mqgw", "broker", "--data-dir", "/data", "--port", "7000", "--host", "0.0.0.0",
            "--advertise", f"{name}:7000", "--group", "g1", "--id", broker_id, "--meta", META,
            "--replication", "sync",
        ]  # fmt: skip
    for name in CONTROLLERS:
        assert argv(services[name]) == ["mqgw", "controller", "--meta", META, "--name", name]
    for name in GATEWAYS:
        assert argv(services[name]) == [
            "mqgw", "serve", "--meta", META, "--node-name", name,
            "--amqp-host", "0.0.0.0", "--admin-host", "0.0.0.0",
        ]  # fmt: skip
    assert argv(services["redis"])[:1] == ["redis-server"]


def test_healthchecks(config: dict[str, Any]) -> None:
    services = config["services"]
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    for name in (*BROKERS, *GATEWAYS):
        test = services[name]["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"], name
        compile(test[3], f"{name} healthcheck", "exec")  # the one-liner is valid Python
    for name in BROKERS:
        assert "7000" in services[name]["healthcheck"]["test"][3]
    for name in GATEWAYS:
        assert "http://127.0.0.1:15672/api/health" in services[name]["healthcheck"]["test"][3]


def test_start_order_waits_for_health(config: dict[str, Any]) -> None:
    services = config["services"]
    for name in (*BROKERS, *CONTROLLERS):
        assert services[name]["depends_on"] == {"redis": {"condition": "service_healthy"}}
    for name in GATEWAYS:
        depends = services[name]["depends_on"]
        assert depends["redis"] == {"condition": "service_healthy"}
        for broker in BROKERS:
            assert depends[broker] == {"condition": "service_healthy"}
        for controller in CONTROLLERS:
            assert depends[controller] == {"condition": "service_started"}


def test_broker_and_redis_data_live_in_named_volumes(config: dict[str, Any]) -> None:
    services = config["services"]
    volumes = set(config["volumes"])
    for name in BROKERS:
        (mount,) = services[name]["volumes"]
        volume, path = mount.split(":")[:2]
        assert volume == f"{name}-data" and volume in volumes and path == "/data"
    (mount,) = services["redis"]["volumes"]
    assert mount.split(":")[:2] == ["redis-data", "/data"]
    assert "--appendonly" in argv(services["redis"])


def test_gateway_ports_are_published_apart_and_can_be_moved() -> None:
    def published(config: dict[str, Any]) -> dict[str, list[str]]:
        return {name: config["services"][name]["ports"] for name in GATEWAYS}

    def as_text(ports: list[Any]) -> list[str]:
        # docker-compose 1.29 prints "HOST:CONTAINER/tcp"-style strings or long-form maps.
        return [
            f"{p['published']}:{p['target']}" if isinstance(p, dict) else p.split("/")[0]
            for p in ports
        ]

    default = {name: as_text(ports) for name, ports in published(compose_config()).items()}
    assert default == {"gw1": ["5672:5672", "15672:15672"], "gw2": ["5673:5672", "15673:15672"]}
    moved = compose_config(MQGW_GW1_AMQP_PORT="6000", MQGW_GW2_ADMIN_PORT="6001")
    ports = {name: as_text(p) for name, p in published(moved).items()}
    assert ports == {"gw1": ["6000:5672", "15672:15672"], "gw2": ["5673:5672", "6001:15672"]}


def test_the_dockerfile_builds_one_python_3_11_slim_image_of_the_project() -> None:
    text = DOCKERFILE.read_text()
    bases = re.findall(r"^FROM (\S+)", text, flags=re.MULTILINE)
    assert bases and all(re.fullmatch(r"python:3\.11-slim(-bookworm)?", b) for b in bases)
    assert "pip wheel --wheel-dir /wheels ." in text
    assert "pip install /wheels/*.whl" in text
    assert re.search(r"^USER 10001", text, flags=re.MULTILINE)
    assert re.search(r"^EXPOSE 5672 15672 7000$", text, flags=re.MULTILINE)
    ignore = (REPO / "compose" / "Dockerfile.dockerignore").read_text().split()
    assert ".venv" in ignore and ".git" in ignore
