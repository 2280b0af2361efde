"""What `mqgw cluster up` says when it fails half-way: which processes it had started and
stopped again (it said "the processes already started were stopped" whatever had happened;
on a running directory, tests/cluster/test_ctl_switchover.py)."""

from __future__ import annotations

from pathlib import Path

from tests.cluster.test_cluster_cli import cli, cluster_dir, entries, remember, running


def test_a_failed_up_names_what_it_stopped_again(tmp_path: Path) -> None:
    with cluster_dir(tmp_path) as (directory, seen):
        # No time to become ready: Redis is started, found not ready, and stopped again.
        failed = cli("up", "--dir", str(directory), "--timeout", "0")
        assert failed.returncode == 1
        assert "redis was not ready within 0 s" in failed.stderr
        assert failed.stderr.rstrip().endswith(
            "mqgw cluster up: stopped again what it had started: redis"
        ), failed.stderr
        data = remember(directory, seen)
        assert not any(running(e) for e in entries(data) if e["pid"])
