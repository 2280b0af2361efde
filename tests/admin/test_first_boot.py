"""An operator's first hour: the README's configuration on a fresh data directory leaves an
administrator, a start without one says so, and configured users are created once, so what
the admin API changed survives a restart (RabbitMQ's default_user, first boot only)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from bench.servers import check_for
from localcluster.ports import free_port
from tests.harness.processes import REPO, GatewayProcess

NO_ADMINISTRATOR = "no user has the administrator tag"
STOP = {"state": "stopped"}


def readme_toml() -> str:
    """The TOML example of the README's "Run the gateway" part, as written there."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    assert blocks, "README.md has no ```toml example"
    return str(blocks[0])


def gateway_with(tmp_path: Path, config_text: str) -> GatewayProcess:
    """A gateway on tmp_path/data with this config file; the flags only put the data and the
    ports somewhere private (flags win over the file)."""
    config = tmp_path / "mqgw.toml"
    config.write_text(config_text)
    args = ["--config", str(config), "--admin-port", str(free_port())]
    return GatewayProcess(tmp_path / "data", args)


def warning_line(gateway: GatewayProcess) -> str | None:
    return next((line for line in gateway.log_lines if NO_ADMINISTRATOR in line), None)


def test_the_readmes_config_on_a_fresh_data_dir_leaves_an_administrator(tmp_path: Path) -> None:
    text = readme_toml()
    (user,) = tomllib.loads(text)["users"]
    auth = (user["name"], user["password"])
    gateway = gateway_with(tmp_path, text).start()
    try:
        # A control is an administrator's call: with the README's user it must not be 403.
        status, answer = gateway.admin("PUT", "/api/controls/global", STOP, auth)
        assert status == 200, answer
        assert gateway.admin("DELETE", "/api/controls/global", auth=auth)[0] == 204
        assert warning_line(gateway) is None
    finally:
        gateway.stop()


def test_a_start_without_an_administrator_says_so_and_names_the_way_in(tmp_path: Path) -> None:
    app = '[[users]]\nname = "app"\npassword = "s3cret"\n'  # no tags; naming users: no guest
    gateway = gateway_with(tmp_path, app).start()
    try:
        line = check_for(10, lambda: warning_line(gateway))
        assert " WARNING " in line
        assert 'a [[users]] entry with a new name and tags = ["administrator"]' in line
        assert gateway.admin("PUT", "/api/controls/global", STOP, ("app", "s3cret"))[0] == 403
        gateway.stop()
        # The way the warning names: a new user with the tag, and a restart.
        ops = '[[users]]\nname = "ops"\npassword = "pw"\ntags = ["administrator"]\n'
        gateway = gateway_with(tmp_path, app + ops).start()
        assert gateway.admin("PUT", "/api/controls/global", STOP, ("ops", "pw"))[0] == 200
        assert warning_line(gateway) is None
    finally:
        gateway.stop()


def test_api_changes_to_configured_users_survive_a_restart(tmp_path: Path) -> None:
    users = (
        '[[users]]\nname = "ops"\npassword = "ops-pw"\ntags = ["administrator"]\n'
        '[[users]]\nname = "svc"\npassword = "first"\ntags = ["management"]\n'
    )
    gateway = gateway_with(tmp_path, 'vhosts = ["/", "orders"]\n' + users).start()
    ops = ("ops", "ops-pw")
    full = {"configure": ".*", "write": ".*", "read": ".*"}
    narrowed = {"configure": "^$", "write": "^svc\\.", "read": "^svc\\."}
    try:
        # Created at the first start, with full permissions on every configured vhost.
        assert gateway.admin("GET", "/api/whoami", auth=("svc", "first"))[0] == 200
        assert gateway.admin("GET", "/api/permissions/orders/svc", auth=ops)[1].items() >= (
            full.items()
        )
        body = {"password": "second", "tags": "management"}
        assert gateway.admin("PUT", "/api/users/svc", body, ops)[0] in (201, 204)
        assert gateway.admin("PUT", "/api/permissions/orders/svc", narrowed, ops)[0] in (201, 204)
        gateway.stop()
        # Restarted with the same users, and a vhost added: only what is new is applied.
        gateway = gateway_with(tmp_path, 'vhosts = ["/", "orders", "billing"]\n' + users).start()
        # The file still says "first": the password set over HTTP is the one that stands.
        assert gateway.admin("GET", "/api/whoami", auth=("svc", "second"))[0] == 200
        assert gateway.admin("GET", "/api/whoami", auth=("svc", "first"))[0] == 401
        kept = gateway.admin("GET", "/api/permissions/orders/svc", auth=ops)[1]
        assert kept.items() >= narrowed.items()
        added = gateway.admin("GET", "/api/permissions/billing/svc", auth=ops)[1]
        assert added.items() >= full.items()
    finally:
        gateway.stop()
