"""The operator commands against a real local cluster, given nothing but its directory:
`mqgw ctl switchover GROUP --dir D` (by the broker names `cluster status` prints, and by bare
id), `mqgw ctl ... --dir D` (the first gateway's admin API), and what `cluster up` says about
the brokers and about a directory whose cluster runs. One replicated cluster (slow to start)
serves every check."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.cli.commands import clean_env, mqgw
from tests.cluster.test_cluster_cli import cli, cluster_dir, entries, remember, running
from tests.cluster.test_cluster_cli import status as cluster_status
from tests.harness.waiting import check_for


def group(directory: Path) -> dict[str, Any]:
    _code, report = cluster_status(directory)
    (g1,) = report["groups"]
    return dict(g1)


def both_in_sync(directory: Path) -> bool:
    return bool(group(directory)["in_sync"] == ["broker-g1-0", "broker-g1-1"])


@pytest.mark.slow  # 25 s: the default tier keeps within its 40 minutes
def test_switchover_and_ctl_by_the_cluster_directory(tmp_path: Path) -> None:
    with cluster_dir(tmp_path) as (directory, seen):
        d = str(directory)
        started = cli("up", "--dir", d, "--replicas", "2", "--controllers", "2")
        assert started.returncode == 0, started.stdout + started.stderr
        data = remember(directory, seen)
        # It printed "(in sync: 0)", 0 being a broker id: now the names status shows.
        assert re.search(
            r"group g1: broker-g1-[01] is master at epoch 1 \(in sync: broker-g1-[01]\)",
            started.stdout,
        ), started.stdout

        # `up` on the running directory: it said "the processes already started were
        # stopped", while it had started and stopped nothing.
        again = cli("up", "--dir", d, "--replicas", "2")
        assert again.returncode == 1
        assert "already running" in again.stderr
        assert "nothing was started or stopped" in again.stderr
        assert "stopped again" not in again.stderr and "were stopped" not in again.stderr
        assert all(running(e) for e in entries(data))

        env = clean_env(tmp_path)  # no MQGW_ADMIN_*, no credentials file: --dir only
        check_for(20, lambda: both_in_sync(directory))  # both brokers in sync
        before = group(directory)
        master = before["master"]
        other = next(n for n in before["in_sync"] if n != master)

        # --to as status names it: it was refused as "not an in-sync replica (in sync: 0, 1)".
        moved = mqgw("ctl", "switchover", "g1", "--dir", d, "--to", other, env=env)
        assert moved.returncode == 0, moved.stderr
        assert re.fullmatch(
            rf"group g1: master {master} -> {other} at epoch {before['epoch'] + 1} in "
            r"\d+\.\d\d s\n",
            moved.stdout,
        ), moved.stdout  # it said "master 1 -> 0"
        assert group(directory)["master"] == other

        already = mqgw("ctl", "switchover", "g1", "--dir", d, "--to", other, env=env)
        assert already.returncode == 2
        assert already.stderr.strip() == (
            f"mqgw ctl switchover: {other} is the master of g1 already"
        )
        unknown = mqgw("ctl", "switchover", "g1", "--dir", d, "--to", "broker-g1-7", env=env)
        assert unknown.returncode == 2
        assert unknown.stderr.strip().startswith(
            f"mqgw ctl switchover: broker-g1-7 is not an in-sync replica of g1 (master {other}; "
            "in sync: broker-g1-"
        )

        # The bare id still works, once the old master has caught up again.
        check_for(20, lambda: both_in_sync(directory))  # the old master caught up again
        back_id = master.rsplit("-", 1)[1]
        back = mqgw("ctl", "switchover", "g1", "--dir", d, "--to", back_id, env=env)
        assert back.returncode == 0, back.stderr
        assert back.stdout.startswith(f"group g1: master {other} -> {master} at epoch ")

        # ctl by the directory: the first gateway's admin API, as guest (the cluster's user).
        assert mqgw("ctl", "stop", "global", "--dir", d, env=env).returncode == 0
        listed = mqgw("ctl", "list", "--dir", d, env=env)
        assert listed.returncode == 0, listed.stderr
        header, row = listed.stdout.splitlines()
        assert header.split()[:3] == ["SCOPE", "VHOST", "STATE"]
        assert row.split()[:3] == ["global", "-", "stopped"]
        assert mqgw("ctl", "clear", "global", "--dir", d, env=env).returncode == 0
