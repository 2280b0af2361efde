"""`--gateway-cpu`: each gateway process under a cgroup CPU cap of its own.

The arithmetic and the file layout are checked on a fake cgroup tree (plain directories);
one test caps a real `mqgw serve` through the real /sys/fs/cgroup and measures that it holds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from bench import cpu_cap
from bench.cpu_cap import CpuCap, CpuCapError, find_hierarchy, quota_us
from bench.load.scenarios import SCENARIOS
from bench.load.versus import cap_usage, compare_cluster
from bench.processes import tree_cpu_s
from bench.servers import GatewayServer
from mqgw_cli.main import main


@pytest.fixture
def sleeper() -> Iterator[int]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc.pid
    proc.kill()
    proc.wait()


def _fake_v1(root: Path) -> Path:
    cpu = root / "cpu"
    cpu.mkdir(parents=True)
    for name, value in (("cpu.cfs_quota_us", "-1"), ("cpu.cfs_period_us", "100000")):
        (cpu / name).write_text(value)
    (cpu / "cgroup.procs").write_text("")
    return cpu


def _fake_v2(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    (root / "cgroup.procs").write_text("")
    return root


def test_quota_is_cores_times_period() -> None:
    assert quota_us(0.5) == 50_000
    assert quota_us(0.2, period_us=50_000) == 10_000
    assert quota_us(1.5) == 150_000  # more than one core: a quota longer than the period
    for too_small in (0.0, -1.0, 0.005):
        with pytest.raises(CpuCapError, match="below the kernel's minimum"):
            quota_us(too_small)


def test_v1_group_per_process_then_everything_removed(tmp_path: Path, sleeper: int) -> None:
    cpu = _fake_v1(tmp_path)
    cap = CpuCap(0.25, fs_root=tmp_path, remove_dir=shutil.rmtree)
    with cap:
        assert cap.hierarchy is not None and cap.hierarchy.version == 1
        group = cap.cap("cluster-2gw-gw1", sleeper)
        assert group.parent.parent == cpu and group.parent.name.startswith("mqgw-bench-")
        assert (group / "cpu.cfs_quota_us").read_text() == "25000"
        assert (group / "cpu.cfs_period_us").read_text() == "100000"
        assert (group / "cgroup.procs").read_text() == str(sleeper)
        run_dir = group.parent
    # Still inside at the end: moved back to where it came from (the root), then removed.
    assert (cpu / "cgroup.procs").read_text() == str(sleeper)
    assert not run_dir.exists() and cap.left == []


def test_v2_enables_cpu_on_each_parent_and_sets_cpu_max(tmp_path: Path, sleeper: int) -> None:
    root = _fake_v2(tmp_path / "cgroup")
    with CpuCap(0.5, fs_root=root, remove_dir=shutil.rmtree) as cap:
        group = cap.cap("embedded", sleeper)
        assert (root / "cgroup.subtree_control").read_text() == "+cpu"
        assert (group.parent / "cgroup.subtree_control").read_text() == "+cpu"
        assert (group / "cpu.max").read_text() == "50000 100000"
    assert [p.name for p in root.iterdir() if p.is_dir()] == []


def test_stale_run_of_a_dead_bench_is_removed(tmp_path: Path) -> None:
    cpu = _fake_v1(tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (cpu / f"mqgw-bench-{dead.pid}" / "gw1").mkdir(parents=True)
    with CpuCap(0.5, fs_root=tmp_path, remove_dir=shutil.rmtree) as cap:
        assert cap.run_dir is not None
        assert [p.name for p in cpu.iterdir() if p.is_dir()] == [cap.run_dir.name]


def test_no_cpu_controller_says_what_is_needed(tmp_path: Path) -> None:
    with pytest.raises(CpuCapError, match="needs root and a writable cpu cgroup controller"):
        find_hierarchy(tmp_path)
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    with pytest.raises(CpuCapError, match="no cpu controller in"):
        find_hierarchy(tmp_path)


def test_unwritable_hierarchy_is_a_clear_error(tmp_path: Path) -> None:
    cpu = _fake_v1(tmp_path)
    cap = CpuCap(0.5, fs_root=tmp_path, remove_dir=shutil.rmtree)
    run_dir = cpu / f"mqgw-bench-{os.getpid()}"
    run_dir.write_text("")  # a file where the run directory goes: mkdir fails
    with pytest.raises(CpuCapError, match=r"cannot create .*needs root"):
        cap.open()
    assert cap.run_dir is None


def test_cli_refuses_gateway_cpu_without_cluster_and_without_cgroups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit, match="--gateway-cpu goes with --with-cluster"):
        main(["bench", "compare", "--with-rabbitmq", "--gateway-cpu", "0.5"])
    monkeypatch.setattr(cpu_cap, "CGROUP_FS", tmp_path)  # no cpu controller here
    with pytest.raises(SystemExit) as refused:
        main(["bench", "compare", "--with-cluster", "--gateway-cpu", "0.5"])
    message = str(refused.value)
    assert message.startswith("mqgw bench compare: --gateway-cpu: no cpu cgroup controller")
    assert "needs root" in message and "\n" not in message


def test_cap_usage_per_run() -> None:
    before = {"gw1": {"periods": 100.0, "throttled": 10.0, "cpu_s": 1.0}}
    after = {"gw1": {"periods": 300.0, "throttled": 160.0, "cpu_s": 11.0}}
    assert cap_usage(before, after, busy_s=20.0) == {
        "gw1": {"cpu_s": 10.0, "cores": 0.5, "throttled_share": 0.75}
    }


def _publish_until(url: str, stop: threading.Event, errors: list[BaseException]) -> None:
    """64 KB transient messages into a queue capped at 100: about one core of gateway work
    on this machine, uncapped."""
    try:
        connection = pika.BlockingConnection(pika.URLParameters(url))
        channel = connection.channel()
        channel.queue_declare("cpu-cap", arguments={"x-max-length": 100})
        body = b"x" * 65536
        while not stop.is_set():
            channel.basic_publish("", "cpu-cap", body)
        connection.close()
    except BaseException as error:  # reported by the test, with the gateway's log
        errors.append(error)


def _cores_used(pid: int, seconds: float) -> float:
    cpu_s, started = tree_cpu_s(pid), time.monotonic()
    time.sleep(seconds)  # a measuring window, not a wait for a condition
    return (tree_cpu_s(pid) - cpu_s) / (time.monotonic() - started)


def _cpu_cgroup(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(",") or controllers == "":
            return path
    return "?"


def test_real_gateway_capped_at_a_fifth_of_a_core(tmp_path: Path) -> None:
    gateway = GatewayServer(tmp_path / "gw").start()
    stop = threading.Event()
    errors: list[BaseException] = []
    publisher = threading.Thread(target=_publish_until, args=(gateway.url, stop, errors))
    try:
        origin = _cpu_cgroup(gateway.pid)
        publisher.start()
        # For the messages only: on a quiet machine about one core; a busy one gives less.
        uncapped = _cores_used(gateway.pid, 1.0)
        with CpuCap(0.2) as cap:
            group = cap.cap("gw", gateway.pid)
            assert _cpu_cgroup(gateway.pid).endswith(f"/{group.parent.name}/gw")
            capped = _cores_used(gateway.pid, 2.0)
            stats = cap.stats()["gw"]
        figures = f"capped {capped:.2f} core, uncapped {uncapped:.2f}, cgroup {stats}"
        assert errors == [], f"{errors}: {figures}\n{gateway.log()[-2000:]}"
        # The kernel held it back (no quota, no throttling: fails if the cap does nothing) ...
        assert stats["throttled"] > 0, figures
        # ... to about the cap.
        assert capped <= 0.3, figures
        assert publisher.is_alive()  # still publishing under the cap, not failed
        assert not group.exists() and not group.parent.exists()
        assert _cpu_cgroup(gateway.pid) == origin
    finally:
        stop.set()
        publisher.join(10)
        gateway.stop()


@pytest.mark.slow  # 16 s: the default tier keeps within its 40 minutes
def test_compare_cluster_caps_every_gateway_and_names_the_cap() -> None:
    report = compare_cluster(
        [SCENARIOS["confirm-durable-1k"]], [2], False, 0.005, 1, 1, gateway_cpu=0.5
    )
    assert report["left_running"] == [] and report["cgroups_left"] == []
    assert report["cap"] == "gateway CPU capped at 0.5 core each"
    (summary,) = report["summaries"]
    assert (summary["gateway_cpu"], summary["cap"]) == (0.5, report["cap"])
    assert summary["errors"] == 0
    (row,) = report["rows"]["confirm-durable-1k"]
    assert set(row["cluster-2gw"]["cpu_cap"]) == {"cluster-2gw-gw1", "cluster-2gw-gw2"}
    assert set(row["embedded"]["cpu_cap"]) == {"embedded"}
    for side in report["sides"]:
        assert side["policy"].endswith("; gateway CPU capped at 0.5 core each")
    # Every capped gateway did its part of the work inside its cgroup.
    for usage in (*row["cluster-2gw"]["cpu_cap"].values(), row["embedded"]["cpu_cap"]["embedded"]):
        assert usage["cpu_s"] > 0
    assert not (find_hierarchy().root / f"mqgw-bench-{os.getpid()}").exists()
