"""A typo in the configuration gets a "did you mean": inside a user or a policy it stops the
start, as an unknown top-level key does; an unknown MQGW_* variable is warned about (other
tools share the prefix), naming the variable that was probably meant."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.servers import check_for
from gateway.config.sources import ConfigError, env_hint, resolve
from tests.harness.processes import REPO, GatewayProcess

USER_TYPO = '[[users]]\nname = "app"\npassword = "s3cret"\ntag = ["administrator"]\n'


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (USER_TYPO, "users.0: unknown key 'tag' (did you mean 'tags'?)"),
        (
            '[[users]]\nname = "a"\npasword = "b"\n',
            "unknown key 'pasword' (did you mean 'password'?)",
        ),
        (
            '[[policies]]\nname = "p"\npattern = "x"\ndefinition = {}\naply-to = "queues"\n',
            "policies.0: unknown key 'aply_to' (did you mean 'apply_to'?)",
        ),
    ],
)
def test_a_typo_inside_a_user_or_policy_is_refused_with_a_suggestion(
    tmp_path: Path, text: str, message: str
) -> None:
    config = tmp_path / "mqgw.toml"
    config.write_text(text)
    with pytest.raises(ConfigError) as info:
        resolve({"config_file": config}, {})
    assert message in str(info.value)
    assert f"(from file {config})" in str(info.value)


def test_a_typo_in_users_from_the_environment_names_the_variable() -> None:
    with pytest.raises(ConfigError) as info:
        resolve({}, {"MQGW_USERS": '{"name": "a", "password": "b", "tagz": []}'})
    assert "unknown key 'tagz' (did you mean 'tags'?) (from env MQGW_USERS)" in str(info.value)


def test_mqgw_serve_refuses_a_typo_inside_users(tmp_path: Path) -> None:
    config = tmp_path / "mqgw.toml"
    config.write_text(USER_TYPO)
    command = [sys.executable, "-m", "mqgw_cli.main", "serve", "--config", str(config)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "unknown key 'tag' (did you mean 'tags'?)" in done.stderr


def test_an_unknown_variable_gets_the_closest_settings_variable() -> None:
    hints = {
        "MQGW_AMQP_PROT": " (did you mean MQGW_AMQP_PORT?)",
        "MQGW_LOG_LEVLES__STORAGE": " (did you mean MQGW_LOG_LEVELS?)",
        "MQGW_CRASH_SEED": "",  # another tool's: nothing close, no guess
    }
    assert resolve({}, dict.fromkeys(hints, "1")).unknown_env == sorted(hints)
    assert {var: env_hint(var) for var in hints} == hints


def test_config_show_and_serve_warn_with_the_suggestion(tmp_path: Path) -> None:
    env = {**os.environ, "MQGW_AMQP_PROT": "5673"}
    command = [sys.executable, "-m", "mqgw_cli.main", "config", "show"]
    shown = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0
    expected = "MQGW_AMQP_PROT names no setting: ignored (did you mean MQGW_AMQP_PORT?)"
    assert expected in shown.stderr
    gateway = GatewayProcess(tmp_path / "data", env={"MQGW_AMQP_PROT": "5673"}).start()
    try:
        check_for(10, lambda: any(expected in line for line in gateway.log_lines))
    finally:
        gateway.stop()
