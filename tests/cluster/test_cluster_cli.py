"""`mqgw cluster up|status|stop|start|down`, run as users run it: the real CLI in a subprocess,
real redis-server, brokers and gateways, a real client (pika).

The processes the CLI starts outlive it by design (own session, no parent-death signal), so
every test tears down in a ``finally``: `down`, then SIGKILL for any pid still ours.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pika

from tests.harness.processes import REPO
from tests.harness.waiting import check_for

GATEWAY_FIELDS = {"name", "pid", "amqp_url", "admin_url", "amqp_port", "admin_port", "data_dir"}
BROKER_FIELDS = {"name", "group", "role", "pid", "address", "port", "data_dir"}
REDIS_FIELDS = {"name", "pid", "port", "url"}


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mqgw_cli.main", "cluster", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def state(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / "cluster.json").read_text())
    return data


def entries(data: dict[str, Any]) -> list[dict[str, Any]]:
    watcher = [data["watcher"]] if data.get("watcher") else []
    return [data["redis"], *data.get("controllers", []), *data["brokers"], *data["gateways"],
            *watcher]  # fmt: skip


def running(entry: dict[str, Any]) -> bool:
    """The process of a cluster.json entry runs (not a zombie) and is that entry's process,
    not another one that got the same pid."""
    pid = entry["pid"]
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
        return False
    if entry["role"] == "redis":  # it retitles itself "redis-server 127.0.0.1:PORT"
        joined = " ".join(args)
        return "redis-server" in joined and str(entry["port"]) in joined
    if entry["role"] == "controller":  # no data dir: its name on its Redis
        return "controller" in args and entry["name"] in args and entry["url"] in args
    return entry["data_dir"] in args


Seen = dict[int, dict[str, Any]]  # every process a cluster had, by pid: its cluster.json entry


@contextmanager
def cluster_dir(tmp_path: Path) -> Iterator[tuple[Path, Seen]]:
    """The cluster's directory and every process it ever had (``remember`` adds to it);
    afterwards none of them runs any more, whatever the test did."""
    directory = tmp_path / "mq"
    seen: Seen = {}
    try:
        yield directory, seen
    finally:
        cli("down", "--dir", str(directory), "--timeout", "10")
        if (directory / "cluster.json").exists():
            remember(directory, seen)
        for entry in seen.values():
            if running(entry):
                os.kill(entry["pid"], signal.SIGKILL)


def remember(directory: Path, seen: Seen) -> dict[str, Any]:
    """cluster.json now, its pids added to ``seen``."""
    data = state(directory)
    seen.update({e["pid"]: dict(e) for e in entries(data) if e["pid"]})
    return data


def port_accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def redis_pong(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(64).startswith(b"+PONG")


def health(admin_url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{admin_url}/api/health", timeout=5) as response:
        assert response.status == 200
        body: dict[str, Any] = json.loads(response.read())
        return body


def round_trip(amqp_url: str, queue: str) -> None:
    """Publish (confirmed) one message on ``queue`` and consume it back, on one gateway."""
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue=queue)
        body = f"hello {queue}".encode()
        channel.basic_publish(exchange="", routing_key=queue, body=body, mandatory=True)
        got = next(channel.consume(queue, inactivity_timeout=10))
        method, _properties, received = got
        assert method is not None, f"nothing delivered from {queue} within 10 s"
        assert received == body
        channel.basic_ack(method.delivery_tag)
        channel.cancel()
    finally:
        connection.close()


def status(directory: Path) -> tuple[int, dict[str, Any]]:
    result = cli("status", "--dir", str(directory), "--json")
    return result.returncode, json.loads(result.stdout)


def test_up_status_stop_start_down(tmp_path: Path) -> None:
    with cluster_dir(tmp_path) as (directory, seen):
        d = str(directory)
        started = cli("up", "--dir", d, "--gateways", "2")
        assert started.returncode == 0, started.stdout + started.stderr
        data = remember(directory, seen)

        # cluster.json: every process, its fields, live pids and ports that answer.
        assert data["redis"].keys() >= REDIS_FIELDS
        assert data["redis"]["url"] == f"redis://127.0.0.1:{data['redis']['port']}/0"
        assert redis_pong(data["redis"]["port"])
        (broker,) = data["brokers"]
        assert broker.keys() >= BROKER_FIELDS
        assert (broker["name"], broker["group"], broker["role"]) == ("broker-g1-0", "g1", "master")
        assert broker["address"] == f"127.0.0.1:{broker['port']}"
        assert port_accepts(broker["port"])
        assert [g["name"] for g in data["gateways"]] == ["gw1", "gw2"]
        for gateway in data["gateways"]:
            assert gateway.keys() >= GATEWAY_FIELDS
            assert port_accepts(gateway["amqp_port"])
            assert health(gateway["admin_url"])["status"] == "ok"
        for entry in entries(data):
            assert entry["alive"] is True
            assert running(entry), entry
            assert (directory / "logs" / f"{entry['name']}.log").exists()
        assert len({p for e in entries(data) for p in _ports(e)}) == 6  # all distinct

        # A client on each gateway: publish and consume (single-gateway behaviour only).
        for gateway in data["gateways"]:
            round_trip(gateway["amqp_url"], f"q-{gateway['name']}")

        # status: healthy, names everyone.
        table = cli("status", "--dir", d)
        assert table.returncode == 0, table.stdout + table.stderr
        for entry in entries(data):
            assert entry["name"] in table.stdout
        code, report = status(directory)
        assert code == 0 and report["healthy"] is True
        assert {p["name"] for p in report["processes"]} == {e["name"] for e in entries(data)}

        # A second `up` refuses while it runs.
        again = cli("up", "--dir", d)
        assert again.returncode == 1
        assert "already running" in again.stderr and "cluster down" in again.stderr

        # kill -9 the broker: status says so.
        stopped = cli("stop", "--dir", d, "broker-g1-0", "--kill")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert not running(broker)
        after_kill = remember(directory, seen)["brokers"][0]
        assert (after_kill["pid"], after_kill["alive"]) == (None, False)
        code, report = status(directory)
        assert code == 1 and report["healthy"] is False
        (dead,) = [p for p in report["processes"] if p["name"] == "broker-g1-0"]
        assert (dead["alive"], dead["healthy"]) == (False, False)
        assert cli("status", "--dir", d).returncode == 1

        # start brings it back: same port, same data, a new pid, healthy again.
        back = cli("start", "--dir", d, "broker-g1-0")
        assert back.returncode == 0, back.stdout + back.stderr
        restarted = remember(directory, seen)["brokers"][0]
        assert restarted["alive"] is True and restarted["pid"] != broker["pid"]
        assert (restarted["port"], restarted["data_dir"]) == (broker["port"], broker["data_dir"])
        assert running(restarted)
        check_for(15, lambda: status(directory)[0] == 0)

        # down: nothing left running, cluster.json says so, status fails.
        before = remember(directory, seen)
        down = cli("down", "--dir", d)
        assert down.returncode == 0, down.stdout + down.stderr
        for entry in entries(before):
            assert not running(entry), entry
        assert all(e["pid"] is None and e["alive"] is False for e in entries(state(directory)))
        code, report = status(directory)
        assert code == 1
        assert not any(p["alive"] for p in report["processes"])


def _ports(entry: dict[str, Any]) -> list[int]:
    return [entry[k] for k in ("port", "amqp_port", "admin_port") if k in entry]


def test_bad_shapes_are_refused_and_nothing_starts(tmp_path: Path) -> None:
    d = str(tmp_path / "mq")
    no_controller = cli("up", "--dir", d, "--replicas", "2", "--controllers", "0")
    assert no_controller.returncode == 2
    assert "needs a controller to elect masters" in no_controller.stderr
    for flags in (["--replicas", "0"], ["--groups", "0"], ["--controllers", "-1"]):
        refused = cli("up", "--dir", d, *flags)
        assert refused.returncode == 2, flags
        assert "must be ≥" in refused.stderr
    assert not (tmp_path / "mq").exists()


def test_cluster_json_formats(tmp_path: Path) -> None:
    """A format 1 file (cluster part 1: no controllers, no epochs) is still read, so an older
    cluster can be stopped; an unknown format is refused with what to do."""
    directory = tmp_path / "mq"
    directory.mkdir()
    logs = directory / "logs"
    old = {
        "format": 1, "dir": str(directory), "meta_url": "redis://127.0.0.1:1/0",
        "redis": {"name": "redis", "role": "redis", "pid": None, "alive": False,
                  "data_dir": str(directory / "redis"), "log": str(logs / "redis.log"),
                  "port": 1, "url": "redis://127.0.0.1:1/0"},
        "brokers": [{"name": "broker-g1-0", "role": "master", "pid": None, "alive": False,
                     "data_dir": str(directory / "brokers/g1-0"), "log": str(logs / "b.log"),
                     "group": "g1", "broker_id": "0", "port": 2, "address": "127.0.0.1:2"}],
        "gateways": [],
    }  # fmt: skip
    (directory / "cluster.json").write_text(json.dumps(old))
    code, report = status(directory)
    assert code == 1  # nothing runs, but it was read
    assert [p["name"] for p in report["processes"]] == ["redis", "broker-g1-0"]
    (broker,) = [p for p in report["processes"] if p["role"] == "master"]
    assert broker["epoch"] == 0
    assert cli("down", "--dir", str(directory)).returncode == 0
    assert state(directory)["format"] == 2  # rewritten by down in the current format
    (directory / "cluster.json").write_text(json.dumps({**old, "format": 99}))
    newer = cli("status", "--dir", str(directory))
    assert newer.returncode == 1
    assert "has format 99; this mqgw reads formats 1, 2 (a newer mqgw wrote it" in newer.stderr


def test_commands_without_a_cluster(tmp_path: Path) -> None:
    d = str(tmp_path / "none")
    missing = cli("status", "--dir", d)
    assert missing.returncode == 1 and "no cluster" in missing.stderr
    assert cli("stop", "--dir", d, "gw1").returncode == 1
    assert cli("start", "--dir", d, "gw1").returncode == 1
    assert not Path(d).exists()  # only `up` creates the directory
    assert cli("down", "--dir", d).returncode == 0  # teardown may always call it
