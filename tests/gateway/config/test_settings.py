"""GatewaySettings from flags, MQGW_* environment and the TOML file: one set of key names,
precedence, errors that name the key and the source, and every store setting reaching
StoreConfig."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.config.settings import GatewaySettings
from gateway.config.sources import ConfigError, resolve, setting_fields, value_kind
from mqgw_cli.config_commands import effective, flags_given
from mqgw_cli.main import build_parser
from storage.log.commit_log import CommitLog
from storage.log.file_system import FileSystem


def _flags(*argv: str) -> dict[str, Any]:
    """What `mqgw serve ARGV` gives as flags, parsed as the command does."""
    return flags_given(build_parser().parse_args(["serve", *argv]))


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mqgw.toml"
    path.write_text(text)
    return path


def test_precedence_flags_over_env_over_file_over_defaults(tmp_path: Path) -> None:
    config = _toml(tmp_path, "amqp_port = 1001\nadmin_port = 1002\nheartbeat_s = 7\n")
    env = {"MQGW_CONFIG_FILE": str(config), "MQGW_AMQP_PORT": "2001", "MQGW_ADMIN_PORT": "2002"}
    resolved = resolve(_flags("--amqp-port", "3001"), env)
    s = resolved.settings
    assert (s.amqp_port, s.admin_port, s.heartbeat_s, s.frame_max) == (3001, 2002, 7, 131072)
    assert str(resolved.source("amqp_port")) == "flag --amqp-port"
    assert str(resolved.source("admin_port")) == "env MQGW_ADMIN_PORT"
    assert str(resolved.source("heartbeat_s")) == f"file {config}"
    assert str(resolved.source("frame_max")) == "default"
    assert str(resolved.source("config_file")) == "env MQGW_CONFIG_FILE"


STORE_SETTINGS = {
    "async_flush_interval_ms": 123,
    "checkpoint_interval_ms": 456,
    "offset_persist_interval_ms": 789,
    "retention_check_interval_ms": 1011,
    "cq_entries_per_segment": 1213,
    "verify_crc_on_read": False,
    "recent_records_bytes": 0,
    "retention_ms": 1415,
    "segment_size_bytes": 1 << 20,
}


@pytest.mark.parametrize("key", sorted(STORE_SETTINGS))
@pytest.mark.parametrize("source", ["file", "env", "flag"])
def test_every_store_setting_reaches_store_config(tmp_path: Path, key: str, source: str) -> None:
    value = STORE_SETTINGS[key]
    text = str(value).lower()
    flags: dict[str, Any] = {}
    # Small segments must hold the largest message: a smaller one than the default.
    env: dict[str, str] = {"MQGW_MAX_MESSAGE_SIZE_BYTES": str(64 << 10)}
    if source == "file":
        flags = _flags("--config", str(_toml(tmp_path, f"{key.replace('_', '-')} = {text}\n")))
    elif source == "env":
        env[f"MQGW_{key.upper()}"] = text
    elif isinstance(value, bool):
        flags = _flags(f"--{'' if value else 'no-'}{key.replace('_', '-')}")
    else:
        flags = _flags(f"--{key.replace('_', '-')}", text)
    resolved = resolve(flags, env)
    assert getattr(resolved.settings.store_config(), key) == value
    assert resolved.source(key).kind == source


def test_message_size_defaults_to_rabbitmq_3x_and_sizes_the_store_records() -> None:
    settings = resolve({}, {}).settings
    assert settings.max_message_size_bytes == 128 << 20  # RabbitMQ 3.10's max_message_size
    assert settings.store_config().max_record_bytes == (128 << 20) + (64 << 10)
    largest = resolve({}, {"MQGW_MAX_MESSAGE_SIZE_BYTES": str(512 << 20)}).settings
    assert largest.store_config().max_record_bytes == (512 << 20) + (64 << 10)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"MQGW_MAX_MESSAGE_SIZE_BYTES": str((512 << 20) + 1)},
            "max_message_size_bytes: Value error, at most 536870912 (512 MiB, RabbitMQ's limit)"
            " (got '536870913' from env MQGW_MAX_MESSAGE_SIZE_BYTES)",
        ),
        (
            {"MQGW_SEGMENT_SIZE_BYTES": str(1 << 20)},
            "segment_size_bytes: Value error, a segment of 1048576 bytes cannot hold the largest "
            "message (max_message_size_bytes 134217728 plus 65536 bytes of record headers): "
            "make segment_size_bytes at least 134283320 or lower max_message_size_bytes",
        ),
    ],
)
def test_message_size_beyond_what_rabbitmq_or_a_segment_holds_is_refused(
    env: dict[str, str], expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        resolve({}, env)
    assert expected in str(info.value)


def test_the_segment_size_the_error_asks_for_is_enough(tmp_path: Path) -> None:
    env = {"MQGW_MAX_MESSAGE_SIZE_BYTES": "1000000"}
    with pytest.raises(ConfigError, match="at least 1065592 "):
        resolve({}, {**env, "MQGW_SEGMENT_SIZE_BYTES": "1065591"})
    config = resolve({}, {**env, "MQGW_SEGMENT_SIZE_BYTES": "1065592"}).settings.store_config()
    # The commitlog takes that record limit with that segment (it refuses one that does not fit).
    CommitLog(FileSystem(), tmp_path, config.segment_size_bytes, config.max_record_bytes)
    with pytest.raises(ValueError, match="must fit in one commitlog segment"):
        CommitLog(FileSystem(), tmp_path, config.segment_size_bytes - 1, config.max_record_bytes)


def test_hyphenated_keys_and_apply_to_in_the_file(tmp_path: Path) -> None:
    config = _toml(
        tmp_path,
        'amqp-port = 5673\nlog-levels = { storage = "warning" }\n'
        '[[policies]]\nname = "ttl"\npattern = "^o"\napply-to = "queues"\n'
        "definition = { message-ttl = 1000 }\n",
    )
    settings = resolve({"config_file": config}, {}).settings
    assert settings.amqp_port == 5673
    assert settings.log_levels == {"storage": "warning"}
    (policy,) = settings.policies
    assert policy.apply_to == "queues"
    assert policy.definition == {"message-ttl": 1000}  # RabbitMQ's own keys stay as they are


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("amqp_prot = 1\n", "unknown key 'amqp_prot' (did you mean 'amqp_port'?)"),
        ("amqp-port = 1\namqp_port = 2\n", "'amqp_port' and 'amqp-port' are the same key"),
        ("config_file = 'x.toml'\n", "'config_file' cannot be set in a config file"),
        ("amqp_port = \n", "invalid TOML"),
        ('[[users]]\nname = "a"\npassword = "b"\ntag = []\n', "users.0: unknown key 'tag'"),
        (
            '[[policies]]\nname = "p"\npattern = "x"\ndefinition = {}\napply-to = "queue"\n',
            "policies.0.apply_to: Input should be 'queues', 'exchanges' or 'all'",
        ),
    ],
)
def test_file_mistakes_name_the_key_and_the_file(tmp_path: Path, text: str, message: str) -> None:
    config = _toml(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        resolve({"config_file": config}, {})
    assert message in str(info.value)
    assert str(config) in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_and_unreadable_files_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config file .*nope\.toml: not found"):
        resolve({"config_file": tmp_path / "nope.toml"}, {})
    with pytest.raises(ConfigError, match=r"cannot read"):
        resolve({}, {"MQGW_CONFIG_FILE": str(tmp_path)})  # a directory


@pytest.mark.parametrize(
    ("flags", "env", "expected"),
    [
        ([], {"MQGW_AMQP_PORT": "x"}, "amqp_port: Input should be a valid integer"),
        ([], {"MQGW_AMQP_PORT": "x"}, "got 'x' from env MQGW_AMQP_PORT"),
        (["--heartbeat-s", "-1"], {}, "heartbeat_s: Input should be greater than or equal"),
        (["--heartbeat-s", "-1"], {}, "got '-1' from flag --heartbeat-s"),
        (["--flush", "sometimes"], {}, "(got 'sometimes' from flag --flush)"),
        ([], {"MQGW_LOG_LEVELS": "storage"}, "expected k=v[,k=v] or a JSON object"),
        ([], {"MQGW_LOG_LEVELS__STORGE": "debug"}, "unknown log category 'storge'"),
        (["--users", "{"], {}, "users: not valid JSON"),
        ([], {"MQGW_LOG_FILE_ROTATION": "12q"}, "bad rotation '12q'"),
    ],
)
def test_bad_values_name_the_key_and_the_source(
    flags: list[str], env: dict[str, str], expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(_flags(*flags), env)
    assert expected in str(info.value)


def test_host_sets_both_hosts_unless_the_same_source_names_one() -> None:
    both = resolve({}, {"MQGW_HOST": "10.0.0.1"})
    assert (both.settings.amqp_host, both.settings.admin_host) == ("10.0.0.1", "10.0.0.1")
    assert str(both.source("admin_host")) == "env MQGW_HOST"
    one = resolve({}, {"MQGW_HOST": "10.0.0.1", "MQGW_ADMIN_HOST": "127.0.0.2"})
    assert (one.settings.amqp_host, one.settings.admin_host) == ("10.0.0.1", "127.0.0.2")
    flag = resolve(_flags("--host", "10.0.0.3"), {"MQGW_AMQP_HOST": "10.0.0.4"})
    assert flag.settings.amqp_host == "10.0.0.3"  # a higher source wins, as always
    mixed = resolve(_flags("--host", "10.0.0.3", "--admin-host", "::1"), {})
    assert (mixed.settings.amqp_host, mixed.settings.admin_host) == ("10.0.0.3", "::1")


def test_lists_tables_and_booleans_from_text() -> None:
    resolved = resolve(
        _flags("--vhosts", "/,a", "--vhosts", "b", "--log-levels", "storage=warning")
        | _flags("--no-log-console", "--disk-budget-bytes", "none"),
        {
            "MQGW_REDELIVERY_LADDER_MS": "[100,200]",
            "MQGW_TIMER_LEVELS_MS": "0, 100, 3000",
            "MQGW_LOG_LEVELS__CONNECTION": "DEBUG",
            "MQGW_USERS": '{"name": "app", "password": "p", "tags": "management,monitoring"}',
            "MQGW_TLS_FAIL_IF_NO_PEER_CERT": "true",
        },
    )
    s = resolved.settings
    assert s.vhosts == ["/", "a", "b"]
    assert s.log_levels == {"storage": "warning"}  # the flag's table replaces the env's
    assert s.redelivery_ladder_ms == [100, 200] and s.timer_levels_ms == [0, 100, 3000]
    assert s.users[0].tags == ["management", "monitoring"]
    assert s.tls_fail_if_no_peer_cert and not s.log_console and s.disk_budget_bytes is None
    env_table = resolve({}, {"MQGW_LOG_LEVELS__CONNECTION": "DEBUG"}).settings.log_levels
    assert env_table == {"connection": "debug"}


def test_unknown_environment_variables_are_reported_not_fatal() -> None:
    resolved = resolve({}, {"MQGW_AMQP_PROT": "1", "MQGW_CRASH_SEED": "3", "OTHER": "x"})
    assert resolved.unknown_env == ["MQGW_AMQP_PROT", "MQGW_CRASH_SEED"]


def test_every_field_has_a_flag_and_show_masks_passwords() -> None:
    parser = build_parser()
    for key, info in setting_fields().items():
        if info.annotation is bool:
            args = parser.parse_args(["serve", f"--no-{key.replace('_', '-')}"])
        else:
            flag = "--config" if key == "config_file" else f"--{key.replace('_', '-')}"
            sample = {"dict": "mqgw.x=info", "models": "{}"}.get(value_kind(key), "1")
            args = parser.parse_args(["serve", flag, sample])
        assert key in flags_given(args), key
    resolved = resolve(_flags("--users", '[{"name": "app", "password": "s3cret"}]'), {})
    rows = {key: (value, str(source)) for key, value, source in effective(resolved)}
    assert rows["users"] == ([{"name": "app", "password": "********", "tags": []}], "flag --users")
    assert "s3cret" not in repr(rows)


def test_global_flags_work_after_any_subcommand() -> None:
    parser = build_parser()
    for argv in (
        ["--log-level", "debug", "serve"],
        ["serve", "--log-level", "debug"],
        ["ctl", "list", "--log-level", "debug"],
        ["queue", "redrive", "q", "--log-level", "debug"],
        ["config", "show", "--log-level", "debug"],
    ):
        args = parser.parse_args(argv)
        assert flags_given(args)["log_level"] == "debug", argv


def test_direct_construction_and_load_read_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MQGW_HOST", "127.0.0.9")
    monkeypatch.setenv("MQGW_VHOSTS", "/,x")
    direct = GatewaySettings(data_dir=tmp_path)
    assert (direct.amqp_host, direct.admin_host, direct.vhosts) == ("127.0.0.9",) * 2 + (
        ["/", "x"],
    )
    loaded = GatewaySettings.load(_toml(tmp_path, "heartbeat_s = 5\n"), amqp_port=1)
    assert (loaded.heartbeat_s, loaded.amqp_port, loaded.admin_host) == (5, 1, "127.0.0.9")
