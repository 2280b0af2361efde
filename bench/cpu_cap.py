"""Cap the CPU of benchmark processes with Linux cgroups, as a container's CPU limit would.

On a small machine the whole machine is the bottleneck, so adding a gateway process shows no
gain. Capping each gateway (and only the gateways: broker, Redis and the load generator stay
uncapped) makes the gateway the bottleneck, which is the case a second gateway is for.

Layout: one directory per run, ``<hierarchy>/mqgw-bench-<pid>/``, and in it one cgroup per
capped process with quota = cores x period. cgroup v1 (``/sys/fs/cgroup/cpu/``,
``cpu.cfs_quota_us``) and v2 (``/sys/fs/cgroup/cgroup.controllers`` lists ``cpu``,
``cpu.max``) are both supported. Writing a pid to ``cgroup.procs`` moves every thread of it.
Closing moves any process still inside back to where it came from and removes the
directories, also after an error or Ctrl-C (the caller's ``with``).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from bench.processes import process_tree, tree_cpu_s

CGROUP_FS = Path("/sys/fs/cgroup")
PERIOD_US = 100_000  # the kernel's default CFS period
QUOTA_MIN_US = 1_000  # the kernel refuses a smaller quota
REMOVE_WAIT_S = 3.0  # an exiting process leaves its cgroup a moment after it is gone
RUN_PREFIX = "mqgw-bench-"
NEEDS = (
    "--gateway-cpu needs root and a writable cpu cgroup controller "
    "(cgroup v1 /sys/fs/cgroup/cpu/ or cgroup v2 with cpu in cgroup.controllers)"
)

CapStats = dict[str, dict[str, float]]  # group name -> {"periods", "throttled", "cpu_s"}


class CpuCapError(Exception):
    """The cap cannot be set up here; the message says what is missing, in one line."""


@dataclass(frozen=True)
class Hierarchy:
    """Where the cpu controller is mounted, and which cgroup version it speaks."""

    version: int  # 1 or 2
    root: Path

    def limit_files(self, quota_us: int, period_us: int) -> dict[str, str]:
        """The control files (and their contents) that set the quota of one cgroup."""
        if self.version == 1:
            # Period first: the kernel checks the quota against the period in force.
            return {"cpu.cfs_period_us": str(period_us), "cpu.cfs_quota_us": str(quota_us)}
        return {"cpu.max": f"{quota_us} {period_us}"}

    def origin(self, pid: int) -> Path:
        """The cgroup ``pid`` is in now, in this hierarchy (the root if unknown)."""
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return self.root
        for line in lines:
            _, controllers, path = line.split(":", 2)
            wanted = controllers == "" if self.version == 2 else "cpu" in controllers.split(",")
            if wanted:
                return self.root / path.lstrip("/")
        return self.root


def find_hierarchy(fs_root: Path | None = None) -> Hierarchy:
    fs_root = fs_root or CGROUP_FS
    controllers = fs_root / "cgroup.controllers"
    if controllers.exists():
        if "cpu" not in controllers.read_text().split():
            raise CpuCapError(f"no cpu controller in {controllers}: {NEEDS}")
        return Hierarchy(2, fs_root)
    if (fs_root / "cpu" / "cpu.cfs_quota_us").exists():
        return Hierarchy(1, fs_root / "cpu")
    raise CpuCapError(f"no cpu cgroup controller under {fs_root}: {NEEDS}")


def quota_us(cores: float, period_us: int = PERIOD_US) -> int:
    """CPU time per period for ``cores`` cores (0.5 core: 50 ms of every 100 ms)."""
    quota = round(cores * period_us)
    if not cores > 0 or quota < QUOTA_MIN_US:
        raise CpuCapError(
            f"a cap of {cores} core is below the kernel's minimum "
            f"({QUOTA_MIN_US / period_us:g} core at a {period_us} µs period)"
        )
    return quota


def describe(cores: float) -> str:
    return f"gateway CPU capped at {cores:g} core each"


@dataclass
class _Group:
    path: Path
    pid: int
    origin: Path


@dataclass
class CpuCap:
    """One run's cgroups: ``cap(name, pid)`` puts a process (and its children) under its own
    quota; leaving the ``with`` undoes everything."""

    cores: float
    fs_root: Path | None = None  # None: /sys/fs/cgroup (tests pass a fake tree)
    period_us: int = PERIOD_US
    remove_dir: Callable[[Path], None] = os.rmdir  # cgroupfs removes its control files itself
    hierarchy: Hierarchy | None = None
    run_dir: Path | None = None
    groups: dict[str, _Group] = field(default_factory=dict)
    left: list[Path] = field(default_factory=list)  # what close() could not remove

    @property
    def quota_us(self) -> int:
        return quota_us(self.cores, self.period_us)

    def __enter__(self) -> CpuCap:
        self.open()
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        self.close()

    def open(self) -> None:
        quota_us(self.cores, self.period_us)  # refuse a bad cap before touching anything
        hierarchy = self.hierarchy = find_hierarchy(self.fs_root)
        self._remove_stale_runs(hierarchy.root)
        run_dir = hierarchy.root / f"{RUN_PREFIX}{os.getpid()}"
        try:
            if hierarchy.version == 2:  # children get cpu.max only if each parent enables it
                _write(hierarchy.root / "cgroup.subtree_control", "+cpu")
            run_dir.mkdir()
            self.run_dir = run_dir
            if hierarchy.version == 2:
                _write(run_dir / "cgroup.subtree_control", "+cpu")
        except OSError as error:
            self.close()
            raise CpuCapError(f"cannot create {run_dir}: {error.strerror}; {NEEDS}") from error

    def cap(self, name: str, pid: int) -> Path:
        """Move ``pid`` and its descendants into a new cgroup ``name`` with this cap."""
        assert self.hierarchy is not None and self.run_dir is not None, "open() first"
        path = self.run_dir / name
        try:
            path.mkdir()
            self.groups[name] = _Group(path, pid, self.hierarchy.origin(pid))
            for file, value in self.hierarchy.limit_files(self.quota_us, self.period_us).items():
                _write(path / file, value)
            for member in process_tree(pid):
                with contextlib.suppress(ProcessLookupError):  # a child that just exited
                    _write(path / "cgroup.procs", str(member))
        except OSError as error:
            raise CpuCapError(f"cannot cap pid {pid} in {path}: {error.strerror}") from error
        return path

    def stats(self, names: Iterable[str] | None = None) -> CapStats:
        """Per group (all, or ``names``): CFS periods run, periods throttled, CPU seconds of
        the capped process."""
        out: CapStats = {}
        for name in self.groups if names is None else names:
            group = self.groups[name]
            values = _read_stat(group.path / "cpu.stat")
            out[name] = {
                "periods": values.get("nr_periods", 0),
                "throttled": values.get("nr_throttled", 0),
                "cpu_s": round(tree_cpu_s(group.pid), 3),
            }
        return out

    def close(self) -> None:
        """Move out whatever still runs inside, remove every cgroup, then the run directory."""
        for group in self.groups.values():
            self._remove(group.path, functools.partial(_empty, group, self.hierarchy))
        self.groups.clear()
        if self.run_dir is not None:
            self._remove(self.run_dir, lambda: None)
            self.run_dir = None

    def _remove(self, path: Path, empty: Callable[[], None]) -> None:
        deadline = time.monotonic() + REMOVE_WAIT_S
        while True:
            empty()
            try:
                self.remove_dir(path)
                return
            except FileNotFoundError:
                return
            except OSError as error:
                if error.errno != errno.EBUSY or time.monotonic() > deadline:
                    self.left.append(path)
                    return
            time.sleep(0.05)

    def _remove_stale_runs(self, root: Path) -> None:
        """Empty run directories left by a bench that was SIGKILLed (its pid is gone)."""
        for stale in root.glob(f"{RUN_PREFIX}*"):
            pid = stale.name.removeprefix(RUN_PREFIX)
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                for group in [p for p in stale.iterdir() if p.is_dir()]:
                    with contextlib.suppress(OSError):
                        self.remove_dir(group)
                with contextlib.suppress(OSError):
                    self.remove_dir(stale)


def _write(path: Path, value: str) -> None:
    # One write() per value: cgroupfs takes one pid (or setting) per write.
    with path.open("w") as file:
        file.write(value)


def _read_stat(path: Path) -> dict[str, float]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    return {key: float(value) for key, value in (line.split() for line in lines if line)}


def _empty(group: _Group, hierarchy: Hierarchy | None) -> None:
    """Move every process in ``group`` back to where it came from (or the root), so the
    directory can go."""
    try:
        pids = (group.path / "cgroup.procs").read_text().split()
    except OSError:
        return
    targets = [group.origin, hierarchy.root] if hierarchy is not None else [group.origin]
    for pid in pids:
        for target in targets:
            try:
                _write(target / "cgroup.procs", pid)
                break
            except ProcessLookupError:
                break  # it exited meanwhile
            except OSError:
                continue
