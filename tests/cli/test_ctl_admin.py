"""`mqgw ctl`, `mqgw queue` and `mqgw definitions`: where the admin API is and who calls it
(--admin, MQGW_ADMIN_URL, admin_port as `mqgw serve` reads it, MQGW_ADMIN_USER/PASSWORD, a
credentials file), errors that name the URL, and `ctl list` as a table or JSON. A real
gateway and a server that is not mqgw."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster.ports import free_port
from tests.cli.commands import clean_env, mqgw
from tests.cli.conftest import NotMqgw
from tests.harness.processes import GatewayProcess

OPS = ("ops", "s3cret")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """Its only user is ops (administrator): no guest, so a call as guest is refused."""
    users = json.dumps([{"name": OPS[0], "password": OPS[1], "tags": ["administrator"]}])
    args = ["--users", users, "--admin-port", str(free_port())]
    process = GatewayProcess(tmp_path_factory.mktemp("gw") / "data", args).start()
    yield process
    process.stop()


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def test_a_404_from_a_server_that_is_not_mqgw_says_so_and_names_the_url(
    not_mqgw: NotMqgw, tmp_path: Path
) -> None:
    # As the issue had it: a RabbitMQ on the admin port, and `mqgw ctl list` printed only
    # "404 Not Found". Each way of giving the URL is named in the message.
    config = tmp_path / "mqgw.toml"
    config.write_text(f"admin_port = {not_mqgw.port}\n")
    ways = {
        "flag --admin": (["--admin", not_mqgw.url], {}),
        "env MQGW_ADMIN_URL": ([], {"MQGW_ADMIN_URL": not_mqgw.url}),
        "env MQGW_ADMIN_PORT": ([], {"MQGW_ADMIN_PORT": str(not_mqgw.port)}),
        f"file {config}": (["--config", str(config)], {}),
    }
    for source, (flags, env) in ways.items():
        done = mqgw("ctl", "list", *flags, env=clean_env(tmp_path, **env))
        assert done.returncode == 1, done.stderr
        line = one_line(done.stderr)
        assert line.startswith(
            f"mqgw ctl list: GET {not_mqgw.url}/api/controls answered 404 Not Found: "
            f"{not_mqgw.url} is not an mqgw admin API (its /api/overview says RabbitMQ 3.12.1; "
            f"the URL is from {source}"
        ), line
    # The other admin commands name it too.
    export = mqgw("definitions", "export", "-", "--admin", not_mqgw.url, env=clean_env(tmp_path))
    assert export.returncode == 1
    assert f"{not_mqgw.url}/api/definitions answered 404" in export.stderr
    assert "is not an mqgw admin API" in export.stderr


def test_nothing_listening_names_the_url_and_where_it_came_from(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = mqgw("ctl", "list", env=clean_env(tmp_path, MQGW_ADMIN_URL=url))
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert line.startswith(f"mqgw ctl list: cannot reach the admin API at {url}/api/controls")
    assert line.endswith("(the URL is from env MQGW_ADMIN_URL)")


def test_credentials_from_the_environment(gateway: GatewayProcess, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{gateway.admin_port}"
    as_guest = mqgw("ctl", "list", env=clean_env(tmp_path, MQGW_ADMIN_URL=url))
    assert as_guest.returncode == 1
    assert one_line(as_guest.stderr).startswith(
        f"mqgw ctl list: GET {url}/api/controls answered 401 "
    )
    assert as_guest.stderr.rstrip().endswith("(user 'guest' from the default)")

    env = clean_env(
        tmp_path, MQGW_ADMIN_URL=url, MQGW_ADMIN_USER=OPS[0], MQGW_ADMIN_PASSWORD=OPS[1]
    )
    assert mqgw("ctl", "stop", "global", env=env).returncode == 0
    assert gateway.admin("GET", "/api/controls/global", auth=OPS)[1]["state"] == "stopped"
    assert mqgw("ctl", "clear", "global", env=env).returncode == 0


def test_credentials_from_the_credentials_file(gateway: GatewayProcess, tmp_path: Path) -> None:
    home = tmp_path / "home"
    credentials = home / ".config" / "mqgw" / "credentials"
    credentials.parent.mkdir(parents=True)
    credentials.write_text(f'user = "{OPS[0]}"\npassword = "{OPS[1]}"\n')
    credentials.chmod(0o600)
    url = f"http://127.0.0.1:{gateway.admin_port}"
    done = mqgw("ctl", "list", "--admin", url, env=clean_env(home))
    assert done.returncode == 0, done.stderr

    # Elsewhere, named by --credentials or MQGW_ADMIN_CREDENTIALS.
    elsewhere = tmp_path / "ops.toml"
    elsewhere.write_text(credentials.read_text())
    elsewhere.chmod(0o600)
    named = mqgw(
        "ctl", "list", "--admin", url, "--credentials", str(elsewhere), env=clean_env(tmp_path)
    )
    assert named.returncode == 0, named.stderr
    env = clean_env(tmp_path, MQGW_ADMIN_URL=url, MQGW_ADMIN_CREDENTIALS=str(elsewhere))
    assert mqgw("queue", "reset", "nope", "--to", "0", env=env).stderr.count("404") == 1

    # Readable by others: refused, as ssh refuses such a private key.
    credentials.chmod(0o644)
    refused = mqgw("ctl", "list", "--admin", url, env=clean_env(home))
    assert refused.returncode == 2
    assert one_line(refused.stderr) == (
        f"mqgw ctl list: credentials file {credentials} may be read by other users "
        f"(mode 0644): `chmod 600 {credentials}`"
    )


def test_ctl_list_prints_a_table_and_json_for_scripts(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{gateway.admin_port}"
    env = clean_env(
        tmp_path, MQGW_ADMIN_URL=url, MQGW_ADMIN_USER=OPS[0], MQGW_ADMIN_PASSWORD=OPS[1]
    )
    empty = mqgw("ctl", "list", env=env)
    assert (empty.returncode, empty.stdout) == (0, "")
    assert "no consumption controls in force" in empty.stderr
    body = {"rate_msgs": 250.0}
    assert gateway.admin("PUT", "/api/controls/clients/billing", body, auth=OPS)[0] == 200
    assert gateway.admin("PUT", "/api/controls/global", {"state": "stopped"}, auth=OPS)[0] == 200
    try:
        table = mqgw("ctl", "list", env=env)
        assert table.returncode == 0, table.stderr
        header, *rows = table.stdout.splitlines()
        assert header.split() == ["SCOPE", "VHOST", "STATE", "MSGS/S", "BYTES/S", "PUB",
                                  "MSGS/S", "PUB", "BYTES/S", "SET", "BY", "SET", "AT"]  # fmt: skip
        assert [row.split()[:8] for row in rows] == [
            ["client:billing", "-", "-", "250", "-", "-", "-", "ops"],
            ["global", "-", "stopped", "-", "-", "-", "-", "ops"],
        ]
        listed = mqgw("ctl", "list", "--json", env=env)
        assert listed.returncode == 0, listed.stderr
        controls = {(c["scope"], c["name"]): c for c in json.loads(listed.stdout)}
        assert controls[("client", "billing")]["rate_msgs"] == 250
        assert controls[("global", "")]["state"] == "stopped"
    finally:
        for path in ("/api/controls/clients/billing", "/api/controls/global"):
            gateway.admin("DELETE", path, auth=OPS)


def test_throttle_publish_sets_the_publish_rates_of_a_vhost(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{gateway.admin_port}"
    env = clean_env(
        tmp_path, MQGW_ADMIN_URL=url, MQGW_ADMIN_USER=OPS[0], MQGW_ADMIN_PASSWORD=OPS[1]
    )
    try:
        done = mqgw("ctl", "throttle-publish", "vhost:/", "--rate", "500", "--bytes", "1e6",
                    env=env)  # fmt: skip
        assert done.returncode == 0, done.stderr
        status, control = gateway.admin("GET", "/api/controls/vhosts/%2F", auth=OPS)
        assert status == 200, control
        assert (control["scope"], control["vhost"]) == ("vhost", "/")
        assert (control["publish_rate_msgs"], control["publish_rate_bytes"]) == (500, 1e6)
        assert control["rate_msgs"] is None  # deliveries untouched
        lifted = mqgw("ctl", "throttle-publish", "vhost:/", "--rate", "none", env=env)
        assert lifted.returncode == 0, lifted.stderr
        assert (
            gateway.admin("GET", "/api/controls/vhosts/%2F", auth=OPS)[1]["publish_rate_msgs"]
            is None
        )
        empty = mqgw("ctl", "throttle-publish", "global", env=env)
        assert empty.returncode == 2
        assert "throttle-publish needs --rate N and/or --bytes N" in empty.stderr
        queue = gateway.admin("PUT", "/api/controls/queues/%2F/q", {"publish_rate_msgs": 5},
                              auth=OPS)  # fmt: skip
        assert queue[0] == 400, queue  # publishes are throttled before routing
    finally:
        gateway.admin("DELETE", "/api/controls/vhosts/%2F", auth=OPS)


def test_the_password_flag_still_works_and_beats_the_environment(
    not_mqgw: NotMqgw, tmp_path: Path
) -> None:
    # What is sent: flags > MQGW_ADMIN_* > the credentials file, field by field.
    env = clean_env(tmp_path, MQGW_ADMIN_USER="env-user", MQGW_ADMIN_PASSWORD="env-pw")
    mqgw("ctl", "list", "--admin", not_mqgw.url, "--password", "flag-pw", env=env)
    auth = next(a for method, path, a in not_mqgw.requests if path == "/api/controls")
    assert base64.b64decode(auth.removeprefix("Basic ")) == b"env-user:flag-pw"


def test_the_operator_variables_are_no_unknown_settings_to_the_gateway(tmp_path: Path) -> None:
    # One shell may export both: `mqgw serve` / `config show` warned of MQGW_ADMIN_URL.
    env = clean_env(tmp_path, MQGW_ADMIN_URL="http://127.0.0.1:1", MQGW_ADMIN_USER="ops")
    shown = mqgw("config", "show", env=env)
    assert shown.returncode == 0, shown.stderr
    assert "names no setting" not in shown.stderr
