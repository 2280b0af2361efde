"""`mqgw cluster up --backend rocketmq`, run as users run it: the real CLI in a subprocess
starts RocketMQ's JVMs (in D/rocketmq), Redis and two gateways over them; a real client
(pika) publishes through one gateway and consumes through the other.

The processes outlive the CLI by design, so the test tears down in a ``finally``: `down`, then
SIGKILL for any pid of cluster.json or rocketmq.json still running.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.cluster.test_cluster_cli import cli, entries, running, state

# A RocketMQ broker's own clean shutdown takes 11-14 s; past this it is SIGKILLed, which
# `down` reports and which loses nothing the test needs (its data is thrown away).
DOWN_TIMEOUT_S = "3"


def jvms(directory: Path) -> list[dict[str, Any]]:
    """rocketmq.json's processes (name server and brokers), as the cluster's `up` wrote it."""
    data: dict[str, Any] = json.loads((directory / "rocketmq" / "rocketmq.json").read_text())
    processes: list[dict[str, Any]] = data["processes"]
    return processes


def jvm_running(pid: int, conf: str) -> bool:
    """``pid`` runs (not a zombie: its cmdline is empty) and is the JVM with ``conf``."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    return conf in args


@contextmanager
def rocketmq_cluster(tmp_path: Path) -> Iterator[tuple[Path, dict[int, str]]]:
    """The cluster's directory and every JVM pid seen (with its conf); afterwards nothing of
    it runs, whatever the test did."""
    directory = tmp_path / "mq"
    seen: list[dict[str, Any]] = []
    seen_jvms: dict[int, str] = {}
    try:
        yield directory, seen_jvms
    finally:
        cli("down", "--dir", str(directory), "--timeout", DOWN_TIMEOUT_S)
        if (directory / "cluster.json").exists():
            seen += [e for e in entries(state(directory)) if e["pid"]]
        for entry in seen:
            if running(entry):
                os.kill(entry["pid"], signal.SIGKILL)
        for pid, conf in seen_jvms.items():
            if jvm_running(pid, conf):
                os.kill(pid, signal.SIGKILL)


def publish(url: str, queue: str, count: int) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()  # each basic_publish returns once the broker confirmed it
        channel.queue_declare(queue, durable=True)
        for n in range(count):
            props = pika.BasicProperties(delivery_mode=2)
            channel.basic_publish("", queue, b"%d" % n, props, mandatory=True)
    finally:
        connection.close()


def consume(url: str, queue: str, count: int) -> list[int]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=50)
        got: list[int] = []
        for method, _props, body in channel.consume(queue, inactivity_timeout=10):
            assert method is not None, f"stalled after {len(got)} messages"
            channel.basic_ack(method.delivery_tag)
            got.append(int(body))
            if len(got) == count:
                break
        channel.cancel()
        return got
    finally:
        connection.close()


@pytest.mark.slow  # 17 s; rocketmq up and a gateway over it run in the default tier
def test_cluster_up_over_rocketmq(tmp_path: Path) -> None:
    with rocketmq_cluster(tmp_path) as (directory, seen_jvms):
        d = str(directory)
        started = cli("up", "--dir", d, "--backend", "rocketmq", "--gateways", "2")
        assert started.returncode == 0, started.stdout + started.stderr
        processes = jvms(directory)
        seen_jvms.update({p["pid"]: p["conf"] for p in processes if p["pid"]})
        for line in ("✓ redis", "rocketmq: name server up on", "rocketmq: broker-1 up on",
                     "✓ gw1", "✓ gw2"):  # fmt: skip
            assert line in started.stdout, started.stdout

        # cluster.json: the backend, the store URL, Redis and gateways only (no mqgw storage).
        data = state(directory)
        namesrv = next(p for p in processes if p["role"] == "namesrv")
        assert data["backend"] == "rocketmq"
        assert data["store_url"] == f"rocketmq://127.0.0.1:{namesrv['ports']['listen']}"
        assert (data["brokers"], data["controllers"], data["watcher"]) == ([], [], None)
        assert [g["name"] for g in data["gateways"]] == ["gw1", "gw2"]
        assert all(running(e) for e in entries(data))
        assert [p["name"] for p in processes] == ["namesrv", "broker-1"]
        assert all(jvm_running(p["pid"], p["conf"]) for p in processes)

        # Published through gw1, consumed through gw2: all, in order.
        gw1, gw2 = (g["amqp_url"] for g in data["gateways"])
        publish(gw1, "orders", 200)
        assert consume(gw2, "orders", 200) == list(range(200))

        # status: healthy, the RocketMQ processes listed with their pids.
        table = cli("status", "--dir", d)
        assert table.returncode == 0, table.stdout + table.stderr
        for name in ("redis", "gw1", "gw2", "rocketmq-namesrv", "rocketmq-broker-1"):
            assert name in table.stdout, table.stdout
        report = json.loads(cli("status", "--dir", d, "--json").stdout)
        assert report["healthy"] is True and report["backend"] == "rocketmq"
        listed = {p["name"]: p for p in report["processes"]}
        for process in processes:
            assert listed[f"rocketmq-{process['name']}"]["pid"] == process["pid"]
        assert listed["rocketmq-broker-1"]["role"] == "master"

        # down: gateways, RocketMQ, Redis; every pid gone.
        down = cli("down", "--dir", d, "--timeout", DOWN_TIMEOUT_S)
        assert down.returncode == 0, down.stdout + down.stderr
        for entry in entries(data):
            assert not running(entry), entry
        for process in processes:
            assert not jvm_running(process["pid"], process["conf"]), process
        assert all(p["pid"] is None for p in jvms(directory))
