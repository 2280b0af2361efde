"""The admin API's access rules and operator surfaces against a real gateway: the 401/403
matrix by management tag, users/vhosts/permissions in RabbitMQ's shapes, bad input answered
with a JSON error and no harm done, and `mqgw ctl` over the same API."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

import pika
import pytest

from bench.servers import free_port
from tests.harness.processes import GatewayProcess, check_for

USERS = {
    "adm": "administrator",
    "mon": "monitoring",
    "pol": "policymaker",
    "mgmt": "management",
    "plain": "",
}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    data = tmp_path_factory.mktemp("admin") / "data"
    process = GatewayProcess(data, ["--admin-port", str(free_port())]).start()
    for name, tag in USERS.items():
        status, answer = process.admin("PUT", f"/api/users/{name}", {"password": "pw", "tags": tag})
        assert status == 201, answer
        status, answer = process.admin(
            "PUT", f"/api/permissions/%2F/{name}", {"configure": ".*", "write": ".*", "read": ".*"}
        )
        assert status == 201, answer
    yield process
    process.stop()


def call(
    gateway: GatewayProcess, user: str | None, method: str, path: str, body: object = None
) -> int:
    auth = None if user is None else (user, "guest" if user == "guest" else "pw")
    return gateway.admin(method, path, body, auth=auth)[0]


# (method, path, body, the tags that may call it)
MATRIX = [
    ("GET", "/api/queues", None, {"adm", "mon", "pol", "mgmt"}),
    ("GET", "/api/whoami", None, {"adm", "mon", "pol", "mgmt"}),
    ("GET", "/api/vhosts", None, {"adm", "mon", "pol", "mgmt"}),
    ("GET", "/api/controls", None, {"adm", "mon"}),
    ("GET", "/api/timer", None, {"adm", "mon"}),
    ("GET", "/api/policies/%2F", None, {"adm", "mon", "pol", "mgmt"}),
    ("GET", "/api/users", None, {"adm"}),
    ("GET", "/api/permissions", None, {"adm"}),
    ("PUT", "/api/controls/clients/matrix", {"rate_msgs": 5}, {"adm"}),
    ("PUT", "/api/policies/%2F/matrix", {"pattern": "^matrix$", "definition": {}}, {"adm", "pol"}),
    ("PUT", "/api/vhosts/matrix", {}, {"adm"}),
    ("PUT", "/api/users/matrix", {"password": "x", "tags": ""}, {"adm"}),
]


@pytest.mark.parametrize(("method", "path", "body", "allowed"), MATRIX)
def test_who_may_call_what(
    gateway: GatewayProcess, method: str, path: str, body: object, allowed: set[str]
) -> None:
    assert call(gateway, None, method, path, body) == 401
    status, answer = gateway.admin(method, path, body, auth=("adm", "wrong"))
    assert (status, answer["error"]) == (401, "not_authorized")
    for user in USERS:
        expected = {200, 201, 204} if user in allowed else {403}
        assert call(gateway, user, method, path, body) in expected, (user, method, path)


def test_health_is_open_and_a_401_asks_for_basic_auth(gateway: GatewayProcess) -> None:
    assert call(gateway, None, "GET", "/api/health") == 200
    base = f"http://127.0.0.1:{gateway.admin_port}"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(base + "/api/queues", timeout=10)
    assert refused.value.code == 401
    assert refused.value.headers["WWW-Authenticate"].startswith("Basic ")


def test_users_vhosts_permissions_in_rabbitmq_shapes(gateway: GatewayProcess) -> None:
    status, user = gateway.admin("GET", "/api/users/mon")
    assert status == 200
    assert user["tags"] == ["monitoring"] and user["hashing_algorithm"] == (
        "rabbit_password_hashing_sha256"
    )
    assert gateway.admin("PUT", "/api/users/mon", {"tags": "monitoring,policymaker"})[0] == 204
    assert gateway.admin("GET", "/api/whoami", auth=("mon", "pw"))[1] == {
        "name": "mon",
        "tags": ["monitoring", "policymaker"],
    }  # tags changed, the password kept

    assert gateway.admin("PUT", "/api/vhosts/shop", {"description": "the shop"})[0] == 201
    assert gateway.admin("GET", "/api/vhosts/shop")[1]["description"] == "the shop"
    body = {"configure": "^$", "write": "^orders$", "read": ".*"}
    assert gateway.admin("PUT", "/api/permissions/shop/mgmt", body)[0] == 201
    assert gateway.admin("GET", "/api/permissions/shop/mgmt")[1] == {
        "user": "mgmt",
        "vhost": "shop",
        **body,
    }
    # A management user sees the vhosts it has permissions in, no others.
    visible = {v["name"] for v in gateway.admin("GET", "/api/vhosts", auth=("mgmt", "pw"))[1]}
    assert visible == {"/", "shop"}
    assert gateway.admin("DELETE", "/api/permissions/shop/mgmt")[0] == 204
    visible = {v["name"] for v in gateway.admin("GET", "/api/vhosts", auth=("mgmt", "pw"))[1]}
    assert visible == {"/"}

    # The new vhost serves AMQP at once; deleting it closes its connections with 320.
    url = f"amqp://guest:guest@127.0.0.1:{gateway.amqp_port}/shop"
    assert gateway.admin("PUT", "/api/permissions/shop/guest", body | {"configure": ".*"})[0] == 201
    conn = pika.BlockingConnection(pika.URLParameters(url))
    conn.channel().queue_declare("in-shop")
    assert gateway.admin("DELETE", "/api/vhosts/shop")[0] == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        conn.process_data_events(2)
        conn.channel()
    assert closed.value.reply_code == 320
    assert gateway.admin("GET", "/api/vhosts/shop")[0] == 404


def test_a_user_made_over_http_logs_in_over_amqp_and_a_deleted_one_cannot(
    gateway: GatewayProcess,
) -> None:
    gateway.admin("PUT", "/api/users/app", {"password": "s3cret", "tags": ""})
    url = f"amqp://app:s3cret@127.0.0.1:{gateway.amqp_port}/%2F"
    gateway.admin(
        "PUT", "/api/permissions/%2F/app", {"configure": ".*", "write": ".*", "read": ".*"}
    )
    pika.BlockingConnection(pika.URLParameters(url)).close()
    assert gateway.admin("DELETE", "/api/users/app")[0] == 204
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        pika.BlockingConnection(pika.URLParameters(url))
    assert gateway.admin("DELETE", "/api/users/app")[0] == 404


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/api/controls/global", {"rate_msgs": -5}, 400),
        ("/api/controls/global", {"rate_msgs": 0}, 400),
        ("/api/controls/global", {"rate_msgs": "fast"}, 400),
        ("/api/controls/global", {"rate_msgs": True}, 400),
        ("/api/controls/global", {"state": "paused"}, 400),
        ("/api/controls/global", {"stat": "stopped"}, 400),
        ("/api/controls/global", {}, 400),
        ("/api/controls/global", b"{not json", 400),
        ("/api/controls/global", b"[1, 2]", 400),
        ("/api/controls/queues/%2F/no-such-queue", {"state": "stopped"}, 404),
        ("/api/controls/queues/no-such-vhost/q", {"state": "stopped"}, 404),
        ("/api/controls/nodes/some-other-node", {"state": "stopped"}, 404),
        ("/api/controls/connections/1.2.3.4%3A5%20-%3E%206.7.8.9%3A10", {"rate_msgs": 1}, 404),
        ("/api/users/x", {"password": 5}, 400),
        ("/api/permissions/%2F/adm", {"configure": ".*"}, 400),
        ("/api/permissions/%2F/nobody", {"configure": ".*", "write": ".*", "read": ".*"}, 404),
        ("/api/policies/%2F/p", b"\xff\xfe", 400),
    ],
)
def test_bad_input_gets_a_json_error_and_changes_nothing(
    gateway: GatewayProcess, path: str, body: object, status: int
) -> None:
    before = gateway.admin("GET", "/api/controls")[1]
    got, answer = gateway.admin("PUT", path, body)
    assert got == status, answer
    assert set(answer) == {"error", "reason"} and answer["reason"]
    assert gateway.admin("GET", "/api/controls")[1] == before
    assert gateway.admin("GET", "/api/health", auth=None)[1]["status"] == "ok"


def test_an_invalid_permission_regex_is_refused(gateway: GatewayProcess) -> None:
    body = {"configure": "(", "write": ".*", "read": ".*"}
    status, answer = gateway.admin("PUT", "/api/permissions/%2F/plain", body)
    assert status == 400 and "configure" in answer["reason"]


def ctl(
    gateway: GatewayProcess, *args: str, user: str = "guest"
) -> subprocess.CompletedProcess[str]:
    admin = f"http://127.0.0.1:{gateway.admin_port}"
    password = "guest" if user == "guest" else "pw"
    return subprocess.run(
        [sys.executable, "-m", "mqgw_cli.main", "ctl", *args,
         "--admin", admin, "--user", user, "--password", password],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_mqgw_ctl_stop_start_throttle_clear(gateway: GatewayProcess) -> None:
    with pika.BlockingConnection(pika.URLParameters(gateway.url)) as conn:
        conn.channel().queue_declare("ctl-q")
    result = ctl(gateway, "stop", "queue:ctl-q")
    assert result.returncode == 0, result.stderr
    assert gateway.admin("GET", "/api/controls/queues/%2F/ctl-q")[1]["state"] == "stopped"
    assert ctl(gateway, "throttle", "client:billing", "--rate", "250").returncode == 0
    listed = ctl(gateway, "list", "--json")
    assert '"billing"' in listed.stdout and "250" in listed.stdout
    assert ctl(gateway, "throttle", "client:billing", "--rate", "none").returncode == 0
    assert gateway.admin("GET", "/api/controls/clients/billing")[0] == 404
    assert ctl(gateway, "start", "queue:ctl-q").returncode == 0
    assert gateway.admin("GET", "/api/controls/queues/%2F/ctl-q")[1]["state"] == "running"
    assert ctl(gateway, "clear", "queue:ctl-q").returncode == 0
    assert gateway.admin("GET", "/api/controls/queues/%2F/ctl-q")[0] == 404

    refused = ctl(gateway, "stop", "global", user="mon")
    assert refused.returncode == 1 and "403" in refused.stderr
    missing = ctl(gateway, "stop", "queue:nope")
    assert missing.returncode == 1 and "404" in missing.stderr
    bad = ctl(gateway, "stop", "galaxy:far")
    assert bad.returncode == 2 and "unknown scope" in bad.stderr
    node = urllib.parse.quote(gateway.admin("GET", "/api/health")[1]["node"], safe="")
    assert ctl(gateway, "stop", f"node:{urllib.parse.unquote(node)}").returncode == 0
    check_for(5, lambda: gateway.admin("GET", f"/api/controls/nodes/{node}")[0] == 200)
    assert ctl(gateway, "clear", f"node:{urllib.parse.unquote(node)}").returncode == 0
