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
from bench.load.runner import Target
from bench.servers import GatewayServer

console = Console(stderr=True)


def run(names: list[str], scale: float, procs: int, out: Path, html: bool) -> int:
    if importlib.util.find_spec("pyinstrument") is None:
        console.print("mqgw bench profile: pyinstrument is not installed (pip install mqgw[test])")
        return 2
    scenarios = pick(names)
    out = out.resolve()
    renderer = "html" if html else "text"
    with tempfile.TemporaryDirectory(prefix="mqgw-profile-") as root:
        server = GatewayServer(
            Path(root, "data"),
            flush="sync",
            launcher=["-m", "pyinstrument", "-r", renderer, "-o", str(out)],
        ).start()
        try:
            target = Target(server.url, "mqgw", f"mqgw (profiled): {server.flush_policy}",
                            server.pid, Path(root, "data"))  # fmt: skip
            for scenario in scenarios:
                console.print(f"profiling {scenario.name}")
                run_one(scenario, target, scale, procs)
        finally:
            code = server.stop()
    if code != 0 or not out.is_file():
        console.print(f"mqgw bench profile: the gateway exited with {code}; no report written")
        return 1
    console.print(f"profile of the gateway ({renderer}): {out}")
    return 0
