"""`mqgw bench profile SCENARIO`: where a gateway's time goes under a load scenario.

The gateway (sync flush, loopback, a fresh data directory) runs under pyinstrument, a sampling
profiler of the main thread (the event loop, where every message's Python runs; the fsync
thread only waits in the kernel). The scenarios of `mqgw bench run` run against it, SIGTERM
stops it cleanly, and pyinstrument writes its report: the call tree with the seconds spent in
each function, as text or HTML. Profile before optimizing: docs/benchmarks.md, "Profiling".
The figures a profiled gateway reaches are not benchmark figures (sampling slows it down).
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path

from rich.console import Console

from bench.load.compare import pick, run_one
from bench.load.sides import gateway_target

console = Console(stderr=True)


def run(names: list[str], scale: float, procs: int, out: Path, html: bool) -> int:
    if importlib.util.find_spec("pyinstrument") is None:
        console.print("mqgw bench profile: pyinstrument is not installed (pip install mqgw[test])")
        return 2
    scenarios = pick(names)
    out = out.resolve()
    out.unlink(missing_ok=True)  # the report is there afterwards only if this run wrote it
    renderer = "html" if html else "text"
    launcher = ["-m", "pyinstrument", "-r", renderer, "-o", str(out)]
    with (
        tempfile.TemporaryDirectory(prefix="mqgw-profile-") as root,
        gateway_target(Path(root), launcher) as target,
    ):
        for scenario in scenarios:
            console.print(f"profiling {scenario.name}")
            run_one(scenario, target, scale, procs)
    if not out.is_file():  # pyinstrument writes once the gateway has stopped cleanly
        console.print("mqgw bench profile: the gateway did not stop cleanly; no report written")
        return 1
    console.print(f"profile of the gateway ({renderer}): {out}")
    return 0
