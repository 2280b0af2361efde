"""A process that gives up starting with the product's one line is started again, as a
supervisor would; any other exit stays a crash (localcluster/nemesis/cluster.py; nemesis
seed 121: a gateway restarted while its broker group had no master exited, as it should,
and the run stopped on it)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from localcluster.nemesis.cluster import HOSTS, NemesisCluster, Process


class _Machine:
    addresses = {host: f"10.0.0.{n}" for n, host in enumerate(HOSTS, 2)}


def _exited(status: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["sh", "-c", f"exit {status}"])
    proc.wait()
    return proc


def test_only_a_start_failure_is_started_again(tmp_path: Path) -> None:
    cluster = NemesisCluster(_Machine(), tmp_path)  # type: ignore[arg-type]
    started: list[tuple[str, str]] = []

    def start(process: Process) -> Any:
        started.append((process.host, process.role))

    cluster._start = start  # type: ignore[method-assign]
    logs = tmp_path / "logs"
    (logs / "gw1-gateway.log").write_text(
        "... queue 'q' waits for its broker group\n"
        "mqgw serve: cannot start: the message store did not answer: group g1: no master\n"
    )
    (logs / "gw2-gateway.log").write_text("Traceback (most recent call last):\nKeyError: 1\n")
    (logs / "b0-broker.log").write_text("mqgw broker: cannot start: port in use\n")
    exited = {("gw1", "gateway"), ("gw2", "gateway"), ("b0", "broker")}
    for process in cluster.processes:
        if (process.host, process.role) in exited:
            process.proc = _exited(1)
    cluster.down.add("b0")  # killed by the nemesis: the heal restarts it, not this
    assert cluster.restart_failed_starts() == 1
    assert started == [("gw1", "gateway")]
    assert cluster.start_failures == 1
