"""Configuration as `mqgw` processes see it: errors stop `mqgw serve` with exit code 2 and
one line; apply-to, MQGW_HOST, logging flags after the subcommand, JSON log files with
rotation, `--version`, `mqgw config show`."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pika

from bench.servers import free_port
from mqgw_cli.admin_client import admin_call
from tests.harness.processes import REPO, GatewayProcess, check_for, die_with_parent


def _mqgw(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqgw_cli.main", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=die_with_parent,
    )


def _refused(result: subprocess.CompletedProcess[str]) -> str:
    """The one stderr line of a serve that refused its configuration."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("mqgw serve: configuration error: ")
    return line


def test_a_missing_config_file_stops_serve(tmp_path: Path) -> None:
    line = _refused(_mqgw("serve", "--config", "missing.toml", cwd=tmp_path))
    assert "config file missing.toml: not found" in line
    assert not (tmp_path / "data").exists()  # nothing started


def test_an_unknown_key_stops_serve(tmp_path: Path) -> None:
    (tmp_path / "mqgw.toml").write_text("amqp_port = 5673\nretention_hours = 24\n")
    line = _refused(_mqgw("serve", "--config", "mqgw.toml", cwd=tmp_path))
    assert "config file mqgw.toml: unknown key 'retention_hours'" in line


def test_a_bad_value_names_the_key_and_its_source(tmp_path: Path) -> None:
    line = _refused(_mqgw("serve", cwd=tmp_path, env={"MQGW_HEARTBEAT_S": "often"}))
    assert "heartbeat_s: " in line and "got 'often' from env MQGW_HEARTBEAT_S" in line
    (tmp_path / "mqgw.toml").write_text('flush = "sometimes"\n')
    line = _refused(_mqgw("serve", "--config", "mqgw.toml", cwd=tmp_path))
    assert "flush: " in line and "got 'sometimes' from file mqgw.toml" in line
    line = _refused(_mqgw("serve", "--log-file", "no/such/dir/x.log", cwd=tmp_path))
    assert "log_file no/such/dir/x.log: cannot open" in line


def test_apply_to_in_a_toml_policy_applies(tmp_path: Path) -> None:
    config = tmp_path / "mqgw.toml"
    config.write_text(
        '[[policies]]\nname = "ttl"\npattern = "^orders\\\\."\napply-to = "queues"\n'
        "priority = 3\ndefinition = { message-ttl = 60000 }\n"
    )
    args = ["--config", str(config), "--admin-port", str(free_port())]
    process = GatewayProcess(tmp_path / "data", args=args).start()
    try:
        status, policies = process.admin("GET", "/api/policies")
        assert status == 200
        (policy,) = policies
        assert policy["apply-to"] == "queues" and policy["priority"] == 3
        assert policy["pattern"] == "^orders\\." and policy["definition"] == {"message-ttl": 60000}
    finally:
        process.stop()


def test_mqgw_host_sets_both_listeners_and_log_level_follows_serve(tmp_path: Path) -> None:
    admin_port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqgw_cli.main", "serve", "--log-level", "debug",
         "--amqp-port", "0", "--admin-port", str(admin_port), "--data-dir", "data"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "MQGW_HOST": "127.0.0.1"},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, preexec_fn=die_with_parent,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if "node ready" in line or len(lines) > 200:
                break
        ready = lines[-1]
        assert re.search(rf"AMQP on 127\.0\.0\.1:\d+, admin on 127\.0\.0\.1:{admin_port}", ready)
        status, _ = admin_call(f"http://127.0.0.1:{admin_port}", "GET", "/api/health", user=None)
        assert status == 200
    finally:
        proc.terminate()
        assert proc.wait(20) == 0


def test_json_log_file_rotates_and_names_connections(tmp_path: Path) -> None:
    log_file = tmp_path / "mqgw.log"
    args = [
        "--log-level", "debug", "--log-format", "json", "--log-file", str(log_file),
        "--log-file-rotation", "4096", "--log-file-rotation-count", "2",
    ]  # fmt: skip
    process = GatewayProcess(tmp_path / "data", args=args).start()
    try:
        for _ in range(15):
            pika.BlockingConnection(pika.URLParameters(process.url)).close()
        check_for(10, (tmp_path / "mqgw.log.2").exists)
    finally:
        assert process.stop() == 0
    files = sorted(tmp_path.glob("mqgw.log*"))
    assert [f.name for f in files] == ["mqgw.log", "mqgw.log.1", "mqgw.log.2"]
    entries = []
    for path in files:
        assert path.stat().st_size <= 4096
        entries += [json.loads(line) for line in path.read_text().splitlines()]
    assert all({"time", "level", "logger", "category", "message"} <= e.keys() for e in entries)
    accepted = [e for e in entries if str(e["message"]).startswith("accepting AMQP connection")]
    assert accepted
    for entry in accepted:
        assert entry["category"] == "connection" and entry["level"] == "info"
        prefix = f"accepting AMQP connection {entry['connection']}#"
        assert str(entry["message"]).startswith(prefix)


def test_a_category_level_hides_its_lines_only(tmp_path: Path) -> None:
    args = ["--log-levels", "connection=warning"]
    process = GatewayProcess(tmp_path / "data", args=args, env={"MQGW_LOG_FORMAT": "json"})
    process.start()
    try:
        pika.BlockingConnection(pika.URLParameters(process.url)).close()
    finally:
        process.stop()
    entries = [json.loads(line) for line in process.log_lines]
    assert any(str(e["message"]).startswith("mqgw embedded node ready") for e in entries)
    assert not any(e["category"] == "connection" and e["level"] == "info" for e in entries)


def test_version(tmp_path: Path) -> None:
    result = _mqgw("--version", cwd=tmp_path)
    assert result.returncode == 0
    version, hot_paths = result.stdout.strip().splitlines()
    assert version == f"mqgw {importlib.metadata.version('mqgw')}"
    assert hot_paths.startswith("compiled hot paths: ")  # yes, or no (why): test_version.py


def test_config_show_names_the_source_of_each_value(tmp_path: Path) -> None:
    (tmp_path / "mqgw.toml").write_text(
        'amqp-port = 5673\nadmin_port = 15000\n[[users]]\nname = "app"\npassword = "s3cret"\n'
    )
    env = {"MQGW_ADMIN_PORT": "15001", "MQGW_HOST": "127.0.0.1", "MQGW_NOT_A_SETTING": "1"}
    result = _mqgw(
        "config", "show", "--json", "--config", "mqgw.toml", "--admin-host", "::1",
        "--log-level", "debug", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "MQGW_NOT_A_SETTING names no setting" in result.stderr
    rows = {row["key"]: row for row in map(json.loads, result.stdout.splitlines())}
    expected = {
        "config_file": ("mqgw.toml", "flag --config"),
        "amqp_port": (5673, "file mqgw.toml"),
        "admin_port": (15001, "env MQGW_ADMIN_PORT"),
        "amqp_host": ("127.0.0.1", "env MQGW_HOST"),
        "admin_host": ("::1", "flag --admin-host"),
        "log_level": ("debug", "flag --log-level"),
        "frame_max": (131072, "default"),
    }
    for key, (value, source) in expected.items():
        assert (rows[key]["value"], rows[key]["source"]) == (value, source), key
    assert rows["users"]["value"] == [{"name": "app", "password": "********", "tags": []}]
    assert "s3cret" not in result.stdout
    plain = _mqgw("config", "show", "--config", "mqgw.toml", cwd=tmp_path).stdout
    assert "amqp_port = 5673  # file mqgw.toml" in plain.splitlines()
