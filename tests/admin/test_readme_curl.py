"""The README's curl lines, run as written (the port aside) with the real curl against a real
gateway: `curl -d` sends application/x-www-form-urlencoded, and the admin API reads the body
as JSON whatever its content type, as RabbitMQ's does. A body that is not JSON is a 400 that
says so."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from localcluster.ports import free_port
from tests.harness.processes import REPO, GatewayProcess

README_PORT = "15672"
FORM = "application/x-www-form-urlencoded"


def readme_curl_lines() -> list[str]:
    """Every `curl ...` inline command of README.md, its line breaks joined back."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return [re.sub(r"\s*\n\s*", " ", found) for found in re.findall(r"`(curl [^`]+)`", text)]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    data = tmp_path_factory.mktemp("readme-curl") / "data"
    process = GatewayProcess(data, ["--admin-port", str(free_port())]).start()
    yield process
    process.stop()


def curl(command: str, gateway: GatewayProcess) -> tuple[int, str]:
    """Run ``command`` through the shell (its quoting is the README's) against ``gateway``;
    curl's own options appended print the status after the body."""
    line = command.replace(f":{README_PORT}/", f":{gateway.admin_port}/")
    assert line != command, f"no port {README_PORT} to substitute in {command!r}"
    done = subprocess.run(
        ["bash", "-c", line + " --silent --show-error --write-out '\\n%{http_code}'"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    body, _, status = done.stdout.rpartition("\n")
    return int(status), body


def test_the_readmes_curl_lines_work_as_written(gateway: GatewayProcess) -> None:
    lines = readme_curl_lines()
    users = [line for line in lines if "/api/users/" in line]
    permissions = [line for line in lines if "/api/permissions/" in line]
    assert users and permissions, lines
    for line in lines:
        status, body = curl(line, gateway)
        assert 200 <= status < 300, (line, status, body)
    # What they asked for is there (the user and permission lines name the same user).
    name = users[0].rsplit("/", 1)[-1]
    assert gateway.admin("GET", f"/api/users/{name}")[1]["tags"] == ["management"]
    granted = gateway.admin("GET", f"/api/permissions/%2F/{name}")[1]
    assert (granted["configure"], granted["write"], granted["read"]) == (".*", ".*", ".*")


def form_call(gateway: GatewayProcess, method: str, path: str, body: Any) -> tuple[int, Any]:
    """A request as `curl -d` sends it: JSON text under the form content type."""
    text = body if isinstance(body, bytes) else json.dumps(body).encode()
    command = [
        "curl", "--silent", "--show-error", "-u", "guest:guest", "-X", method,
        "-H", f"content-type: {FORM}", "--data-binary", "@-", "--write-out", "\n%{http_code}",
        f"http://127.0.0.1:{gateway.admin_port}{path}",
    ]  # fmt: skip
    done = subprocess.run(command, input=text, capture_output=True, timeout=30, check=True)
    answer, _, status = done.stdout.decode().rpartition("\n")
    return int(status), json.loads(answer) if answer.strip() else None


# Every admin endpoint that takes a JSON body, in the order that makes each one succeed.
BODIES: list[tuple[str, str, Any]] = [
    ("PUT", "/api/vhosts/form-vh", {"description": "from curl -d"}),
    ("PUT", "/api/users/form-user", {"password": "pw", "tags": "management"}),
    ("PUT", "/api/permissions/form-vh/form-user", {"configure": ".*", "write": ".*", "read": ""}),
    ("PUT", "/api/exchanges/%2F/form-x", {"type": "direct", "durable": True}),
    ("PUT", "/api/queues/%2F/form-q", {"durable": True}),
    ("POST", "/api/bindings/%2F/e/form-x/q/form-q", {"routing_key": "k"}),
    (
        "POST",
        "/api/exchanges/%2F/form-x/publish",
        {"routing_key": "k", "payload": "hi", "payload_encoding": "string", "properties": {}},
    ),
    ("POST", "/api/queues/%2F/form-q/get", {"count": 1, "ackmode": "ack_requeue_true"}),
    ("PUT", "/api/policies/%2F/form-p", {"pattern": "^form-q$", "definition": {"max-length": 9}}),
    ("PUT", "/api/controls/queues/%2F/form-q", {"state": "stopped"}),
    ("POST", "/api/queues/%2F/form-q/reset", {"to": "1970-01-01T00:00:00Z"}),
    ("POST", "/api/definitions", {"vhosts": [{"name": "form-vh2"}]}),
]


def test_every_body_taking_endpoint_reads_json_sent_as_a_form(gateway: GatewayProcess) -> None:
    for method, path, body in BODIES:
        status, answer = form_call(gateway, method, path, body)
        assert 200 <= status < 300, (method, path, status, answer)
    assert gateway.admin("GET", "/api/queues/%2F/form-q/bindings")[0] == 200
    control = gateway.admin("GET", "/api/controls/queues/%2F/form-q")[1]
    assert control["state"] == "stopped"


@pytest.mark.parametrize("body", [b'{"password": ', b"password=s3cret&tags=management"])
def test_a_body_that_is_not_json_is_a_400_that_says_so(
    gateway: GatewayProcess, body: bytes
) -> None:
    status, answer = form_call(gateway, "PUT", "/api/users/not-json", body)
    assert status == 400
    assert answer["error"] == "bad_request"
    assert answer["reason"].startswith("the request body is not valid JSON: "), answer
