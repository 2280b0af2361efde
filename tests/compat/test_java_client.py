"""The RabbitMQ Java client (Debian's librabbitmq-client-java, amqp-client 5.0, installed by
scripts/setup-dev) against a real gateway: confirms, manual acks, header types, direct reply-to,
and automatic connection recovery across a gateway restart.

The program is tests/compat/java/Client.java, compiled with the JDK's javac for the test run.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench.servers import free_port
from tests.compat.client_programs import ALL_HEADERS, MESSAGES, build, check_outcome, run_client
from tests.harness.processes import GatewayProcess, die_with_parent

JAVA_DIR = Path(__file__).parent / "java"
CLIENT_JAR = Path("/usr/share/java/amqp-client.jar")
# The client logs through SLF4J; slf4j-simple sends its recovery messages to stderr.
RUNTIME_JARS = [
    CLIENT_JAR,
    Path("/usr/share/java/slf4j-api.jar"),
    Path("/usr/share/java/slf4j-simple.jar"),
]
N = MESSAGES


@pytest.fixture(scope="module")
def java_command(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """`java -cp … Client`, compiled once for this module."""
    classes = tmp_path_factory.mktemp("java")
    build(
        ["javac", "-Xlint:all", "-Werror", "-d", str(classes), "-cp", str(CLIENT_JAR),
         str(JAVA_DIR / "Client.java")],
        needs=[CLIENT_JAR],
    )  # fmt: skip
    classpath = ":".join(str(path) for path in [classes, *RUNTIME_JARS])
    return ["java", "-cp", classpath, "Client"]


def test_java_client_confirms_acks_and_direct_reply_to(
    gateway: GatewayProcess, java_command: list[str]
) -> None:
    check_outcome(run_client([*java_command, gateway.url, "basic", str(N)]), ALL_HEADERS)


@pytest.fixture(scope="module")
def restart_outcome(tmp_path_factory: pytest.TempPathFactory, java_command: list[str]) -> dict:
    """The client consumes from an exclusive server-named queue bound to a non-durable exchange
    and from a durable queue, and parks a transient and a persistent message in another durable
    queue; the gateway restarts (SIGTERM) on the same port and data dir; the client recovers by
    itself, publishes again and reports what it got. Returns its last JSON line, plus the name
    of the exclusive queue before the restart as "queue"."""
    tmp_path = tmp_path_factory.mktemp("java_restart")
    port = free_port()  # the client reconnects to the address it first used
    gateway = GatewayProcess(tmp_path / "data", ["--amqp-port", str(port)]).start()
    client_log = tmp_path / "java.log"
    with client_log.open("w") as log:
        client = subprocess.Popen(
            [*java_command, gateway.url, "recovery"],
            stdout=subprocess.PIPE,
            stderr=log,
            encoding="utf-8",
            preexec_fn=die_with_parent,
        )
    try:
        assert client.stdout is not None
        ready = client.stdout.readline()  # the program has its own timeouts: no hang here
        assert ready, client_log.read_text()

        gateway.stop()
        gateway.start()
        assert gateway.amqp_port == port

        rest, _ = client.communicate(timeout=45)
        assert client.returncode == 0, rest + client_log.read_text()
    finally:
        client.kill()
        gateway.stop()
    outcome: dict = json.loads(rest)
    outcome["queue"] = json.loads(ready)["queue"]
    return outcome


def test_java_automatic_recovery_survives_a_gateway_restart(restart_outcome: dict) -> None:
    """Topology re-declared (the exclusive queue under a new name), consumers resumed."""
    assert restart_outcome["problems"] == []
    assert restart_outcome["via_exchange"] == ["before-x", "after-x"]
    assert restart_outcome["via_durable"] == ["before-q", "after-q"]
    # The exclusive queue died with the gateway: recovery declared a new server-named one.
    renamed, queue = restart_outcome["renamed"], restart_outcome["queue"]
    assert renamed["java_durable_q"] == "java_durable_q"
    assert renamed[queue].startswith("amq.gen-") and renamed[queue] != queue


def test_transient_messages_do_not_survive_a_restart(restart_outcome: dict) -> None:
    """RabbitMQ 3.10 recovers only the persistent messages of a durable classic queue when the
    node starts again; transient ones (delivery-mode 1 or none) are gone (checked with this same
    program against rabbitmq-server 3.10.8: it reports ["persistent"])."""
    assert restart_outcome["parked"] == ["persistent"]
