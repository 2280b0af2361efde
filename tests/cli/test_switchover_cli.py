"""`mqgw ctl switchover` when it cannot do its work: Redis not there (one line naming it, not
redis-py's traceback), no cluster named, a group that is not replicated, a broker of another
group. The switchover itself, against a real cluster: tests/cluster/test_ctl_switchover.py."""

from __future__ import annotations

from pathlib import Path

from localcluster.layout import Shape, new_group, plan
from localcluster.ports import free_port
from tests.cli.commands import clean_env, mqgw

PROG = "mqgw ctl switchover"


def a_cluster_without_processes(directory: Path) -> str:
    """A cluster.json as `mqgw cluster up --replicas 2` and `add-group` (g2, one broker)
    write it, nothing running (its Redis port free): the Redis URL it names."""
    cluster = plan(directory, Shape(gateways=1, replicas=2, controllers=1), None)
    cluster.brokers += new_group(cluster, replicas=1)
    directory.mkdir(parents=True)
    cluster.save()
    return cluster.meta_url


def test_redis_not_there_is_one_line_and_exit_1(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    cluster_url = a_cluster_without_processes(tmp_path / "mq")
    for flags, env, asked in (
        (["--meta", url], {}, url),
        (["--dir", str(tmp_path / "mq")], {}, cluster_url),
        ([], {"MQGW_META": url}, url),
    ):
        done = mqgw("ctl", "switchover", "g1", *flags, env=clean_env(tmp_path, **env))
        assert done.returncode == 1, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr  # it was an 80-line traceback
        assert lines[0].startswith(f"{PROG}: cannot reach Redis at {asked}: "), lines[0]
        assert "Connect" in lines[0]  # the reason: connection refused


def test_a_password_in_the_url_is_not_printed(tmp_path: Path) -> None:
    url = f"redis://:hush@127.0.0.1:{free_port()}/0"
    done = mqgw("ctl", "switchover", "g1", "--meta", url, env=clean_env(tmp_path))
    assert done.returncode == 1
    assert "hush" not in done.stderr and ":***@127.0.0.1" in done.stderr


def test_what_cannot_switch_is_refused_in_one_line(tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    nowhere = mqgw("ctl", "switchover", "g1", env=env)
    assert nowhere.returncode == 2
    assert nowhere.stderr.startswith(f"{PROG}: which cluster? give --dir D")

    a_cluster_without_processes(tmp_path / "mq")
    d = str(tmp_path / "mq")
    lone = mqgw("ctl", "switchover", "g2", "--dir", d, env=env)
    assert lone.returncode == 2
    assert lone.stderr.strip() == (
        f"{PROG}: g2 is not a replicated group of the cluster in {d} (replicated groups: g1): "
        "only a group with replicas can switch masters"
    )
    other = mqgw("ctl", "switchover", "g1", "--dir", d, "--to", "broker-g2-0", env=env)
    assert other.returncode == 2
    assert other.stderr.strip() == (
        f"{PROG}: broker-g2-0 is not a broker of group g1 (its brokers are broker-g1-ID)"
    )
    missing = mqgw("ctl", "switchover", "g1", "--dir", str(tmp_path / "none"), env=env)
    assert missing.returncode == 2 and "no cluster in" in missing.stderr
