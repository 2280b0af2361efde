"""Foreseeable start failures of `mqgw serve`: one clear line on stderr and a non-zero exit,
never a traceback (a port in use, for AMQP or the admin API; a data directory that cannot be
used; a store locked by another node)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.servers import free_port
from tests.harness.processes import GatewayProcess


def _serve(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mqgw_cli.main", "serve", "--host", "127.0.0.1",
               "--data-dir", str(data), *args]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    return done.stderr.strip().splitlines()[-1]


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_an_amqp_port_in_use(tmp_path: Path, taken_port: int) -> None:
    done = _serve(tmp_path / "data", "--amqp-port", str(taken_port), "--admin-port", "0")
    assert _one_line(done) == (
        f"mqgw serve: cannot listen on 127.0.0.1:{taken_port}: address already in use"
    )


def test_an_admin_port_in_use(tmp_path: Path, taken_port: int) -> None:
    done = _serve(tmp_path / "data", "--amqp-port", "0", "--admin-port", str(taken_port))
    assert _one_line(done) == (
        f"mqgw serve: cannot listen on 127.0.0.1:{taken_port} (admin API): address already in use"
    )


def test_a_data_directory_that_cannot_be_used(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    done = _serve(blocker / "data", "--amqp-port", "0", "--admin-port", "0")
    line = _one_line(done)
    assert line.startswith(f"mqgw serve: data directory {blocker / 'data'} is not usable"), line
    assert line.endswith(": not a directory"), line


def test_a_store_locked_by_another_node(tmp_path: Path) -> None:
    first = GatewayProcess(tmp_path / "data", ["--admin-port", str(free_port())]).start()
    try:
        done = _serve(tmp_path / "data", "--amqp-port", "0", "--admin-port", "0")
    finally:
        first.stop()
    line = _one_line(done)
    assert line.startswith("mqgw serve: cannot start: the store "), line
    assert line.endswith("is in use by another process (another node?)"), line
