"""`mqgw bench compare --with-cluster`: a cluster against the embedded node (and RabbitMQ).

Every side runs every scenario in every round; the order of the sides rotates from round to
round, so drift and a warm page cache favour none of them. Per scenario it prints the median
(and spread) of each side's figures, and the median ratio of each cluster side to every side
after it (ratios are taken within a round, then the median over rounds), as JSON lines and a
table. A cluster side's runs also say how many publishes and deliveries each of its gateways
handled (``per_gateway``): the load is meant to cross gateways.

With ``gateway_cpu`` every gateway process (the cluster's and the embedded node) runs under a
CPU cap of its own (bench/cpu_cap.py), so the gateway, not the machine, is the bottleneck;
each run then says how much CPU each capped gateway used and how often it was throttled
(``cpu_cap``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bench.cpu_cap import CapStats, CpuCap, describe
from bench.load.measure import run_scenario
from bench.load.runner import console
from bench.load.scenarios import Scenario
from bench.load.sides import (
    Counters,
    Side,
    cluster_side,
    counters_delta,
    embedded_side,
    pid_alive,
    rabbitmq_side,
    rocketmq_side,
)
from bench.processes import tree_cpu_s

Rows = list[dict[str, dict[str, Any]]]  # per round: side name -> that run's result


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so the clusters (in their own sessions) are stopped."""

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def compare_cluster(
    scenarios: list[Scenario],
    cluster_gateways: list[int],
    with_rabbitmq: bool,
    scale: float,
    rounds: int,
    procs: int,
    gateway_cpu: float | None = None,
    with_rocketmq: bool = False,
) -> dict[str, Any]:
    """Start the sides, run, stop them all; the summaries, the sides and whether every
    process they started has gone. ``gateway_cpu``: cap each gateway at that many cores."""
    sides: list[Side] = []
    cap: CpuCap | None = None
    cap_note = describe(gateway_cpu) if gateway_cpu is not None else None
    with _sigterm_unwinds(), contextlib.ExitStack() as stack:
        root = Path(tempfile.mkdtemp(prefix="mqgw-bench-cluster-"))
        stack.callback(shutil.rmtree, root, ignore_errors=True)
        if gateway_cpu is not None:  # entered first, left last: after every side stopped
            cap = stack.enter_context(CpuCap(gateway_cpu))
            console.print(f"{cap_note} (cgroup v{cap.hierarchy.version if cap.hierarchy else '?'})")
        for gateways in cluster_gateways:
            sides.append(stack.enter_context(cluster_side(root, gateways, cap)))
        if with_rocketmq:
            sides.append(stack.enter_context(rocketmq_side(root)))
        sides.append(stack.enter_context(embedded_side(root, cap)))
        if with_rabbitmq:
            sides.append(stack.enter_context(rabbitmq_side(root)))
        for side in sides:
            console.print(f"{side.name}: {side.target.policy}")
        rows = _rounds(scenarios, sides, scale, rounds, procs)
        console.print("stopping every side")
    left = [pid for side in sides for pid in side.pids if pid_alive(pid)]
    console.print(f"[red]still running: {left}" if left else "every process stopped")
    cgroups_left = [str(path) for path in cap.left] if cap is not None else []
    if cgroups_left:
        console.print(f"[red]cgroups not removed: {', '.join(cgroups_left)}")
    summaries = [_summary(s, rows[s.name], sides, gateway_cpu) for s in scenarios]
    for summary in summaries:
        print(json.dumps(summary), flush=True)
    _table(summaries, sides, cap_note)
    return {
        "summaries": summaries,
        "rows": rows,
        "sides": [_describe(side) for side in sides],
        "left_running": left,
        "gateway_cpu": gateway_cpu,
        "cap": cap_note,
        "cgroups_left": cgroups_left,
    }


def _rounds(
    scenarios: list[Scenario], sides: list[Side], scale: float, rounds: int, procs: int
) -> dict[str, Rows]:
    rows: dict[str, Rows] = {s.name: [] for s in scenarios}
    for round_no in range(rounds):
        order = sides[round_no % len(sides) :] + sides[: round_no % len(sides)]
        for scenario in scenarios:
            row = {}
            for side in order:
                console.print(f"round {round_no + 1}/{rounds}: {scenario.name} on {side.name}")
                row[side.name] = _run(scenario, side, scale, procs)
                figure = row[side.name].get("msgs_per_s", row[side.name].get("error"))
                console.print(f"  {side.name}: {figure} msgs/s")
            rows[scenario.name].append(row)
    return rows


def _run(scenario: Scenario, side: Side, scale: float, procs: int) -> dict[str, Any]:
    before = _counters(side)
    cap_before, started = _cap_stats(side), time.monotonic()
    others_before = {name: tree_cpu_s(pid) for name, pid in side.other_pids.items()}
    try:
        result = run_scenario(scenario, side.target, scale, procs)
    except Exception as error:  # report and go on: one broken scenario must not end the run
        result = {"scenario": scenario.name, "target": side.target.label, "error": str(error)}
    result = {"side": side.name, "gateways": side.gateways, **result}
    cap_after, wall_s = _cap_stats(side), time.monotonic() - started
    after = _counters(side)
    if others_before:  # CPU of the processes beside the gateway (RocketMQ's JVMs), per 100k
        delivered = _number(result, "messages") or 0
        result["cpu_s_by_process"] = {
            name: _per_100k(tree_cpu_s(pid) - others_before[name], delivered)
            for name, pid in side.other_pids.items()
        }
    if before is not None and after is not None:
        result["per_gateway"] = counters_delta(before, after)
    if cap_before is not None and cap_after is not None:
        # Over the measured seconds (the run's busy part), not its setup and teardown.
        result["cpu_cap"] = cap_usage(cap_before, cap_after, _number(result, "seconds") or wall_s)
    print(json.dumps(result), flush=True)
    return result


def _per_100k(cpu_s: float, delivered: float) -> dict[str, float]:
    per = round(cpu_s * 100_000 / delivered, 3) if delivered else 0.0
    return {"cpu_s": round(cpu_s, 2), "cpu_s_per_100k": per}


def _counters(side: Side) -> Counters | None:
    if side.counters is None:
        return None
    try:
        return side.counters()
    except Exception as error:  # a figure for the report, not a reason to stop the run
        console.print(f"[yellow]{side.name}: cannot read gateway counters: {error}")
        return None


def _cap_stats(side: Side) -> CapStats | None:
    if side.cap_stats is None:
        return None
    try:
        return side.cap_stats()
    except (OSError, ValueError) as error:  # a figure for the report, not a reason to stop
        console.print(f"[yellow]{side.name}: cannot read the CPU cap's figures: {error}")
        return None


def cap_usage(before: CapStats, after: CapStats, busy_s: float) -> dict[str, dict[str, float]]:
    """Per capped gateway over one run: CPU seconds, cores used on average over ``busy_s``
    (a slight overestimate: the CPU seconds include setup), and the share of its CFS periods
    in which the cap held it back."""
    usage = {}
    for name, now in after.items():
        then = before.get(name, {})
        cpu_s = now["cpu_s"] - then.get("cpu_s", 0.0)
        periods = now["periods"] - then.get("periods", 0.0)
        throttled = now["throttled"] - then.get("throttled", 0.0)
        usage[name] = {
            "cpu_s": round(cpu_s, 2),
            "cores": round(cpu_s / busy_s, 3) if busy_s > 0 else 0.0,
            "throttled_share": round(throttled / periods, 3) if periods else 0.0,
        }
    return usage


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def _number(result: dict[str, Any], field: str) -> float | None:
    value = result.get(field)
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def ratio_pairs(sides: list[Side]) -> list[tuple[Side, Side]]:
    """Each cluster side against every side listed after it."""
    return [(a, b) for i, a in enumerate(sides) if a.is_cluster for b in sides[i + 1 :]]


def _summary(
    scenario: Scenario, rows: Rows, sides: list[Side], gateway_cpu: float | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "summary": scenario.name,
        "gateway_cpu": gateway_cpu,  # cores per gateway process; None: not capped
        "cap": describe(gateway_cpu) if gateway_cpu is not None else None,
        "rounds": len(rows),
        "figures": list(scenario.ratio_fields),
        "errors": sum(1 for row in rows for r in row.values() if "error" in r),
        "sides": {},
        "ratios": {},
    }
    for side in sides:
        results = [row[side.name] for row in rows]
        entry: dict[str, Any] = {
            "gateways": side.gateways,
            "lost": sum(r.get("lost", 0) for r in results),
            "duplicated": sum(r.get("duplicated", 0) for r in results),
        }
        for field in scenario.ratio_fields:
            entry[field] = _spread([v for r in results if (v := _number(r, field)) is not None])
        out["sides"][side.name] = entry
    for a, b in ratio_pairs(sides):
        ratios: dict[str, Any] = {}
        for field in scenario.ratio_fields:
            values = []
            for row in rows:
                va, vb = _number(row[a.name], field), _number(row[b.name], field)
                if va is not None and vb:
                    values.append(va / vb)
            ratios[field] = _spread(values)
        out["ratios"][f"{a.name}/{b.name}"] = ratios
    return out


def _describe(side: Side) -> dict[str, Any]:
    return {
        "name": side.name,
        "gateways": side.gateways,
        "policy": side.target.policy,
        "urls": list(side.target.urls or (side.target.url,)),
        "pids": side.pids,
    }


def _table(summaries: list[dict[str, Any]], sides: list[Side], cap_note: str | None) -> None:
    pairs = [f"{a.name}/{b.name}" for a, b in ratio_pairs(sides)]
    short = [f"{_short(a)}/{_short(b)}" for a, b in ratio_pairs(sides)]
    title = "cluster comparison: median over rounds (± half the spread); ratios [min-max]"
    # escape: rich would take "[min-max]" for a style tag and drop it
    table = Table(title=escape(f"{title}; {cap_note}" if cap_note else title))
    for col in ("scenario", "figure", *(s.name for s in sides), *short, "lost/dup"):
        table.add_column(col, justify="right", no_wrap=True)
    for summary in summaries:
        for i, field in enumerate(summary["figures"]):
            values = [_fmt_spread(summary["sides"][s.name][field]) for s in sides]
            ratios = [_fmt_ratio(summary["ratios"][p][field]) for p in pairs]
            lost = " ".join(
                f"{e['lost']}/{e['duplicated']}" for e in summary["sides"].values()
            )  # fmt: skip
            table.add_row(
                summary["summary"] if i == 0 else "",
                field,
                *values,
                *ratios,
                lost if i == 0 else "",
            )
    # Not a terminal (piped to a file): rich would wrap the table at 80 columns.
    out = console if console.is_terminal else Console(stderr=True, width=260)
    out.print(table)
    out.print("ratios: " + ", ".join(f"{s} = {p}" for s, p in zip(short, pairs, strict=True)))
    for side in sides:
        gateways = f" ({side.gateways} gateway(s))" if side.is_cluster else ""
        out.print(f"{side.name}{gateways}: {side.target.policy}")


def _short(side: Side) -> str:
    """cluster-2gw -> c2, embedded -> emb, rabbitmq -> rmq: ratio headers stay narrow."""
    if side.is_cluster:
        return f"c{side.gateways}"
    return {"embedded": "emb", "rabbitmq": "rmq"}.get(side.name, side.name)


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


def _fmt_spread(spread: dict[str, float] | None) -> str:
    if spread is None:
        return "-"
    median = spread["median"]
    half = (spread["max"] - spread["min"]) / 2
    return f"{_fmt(median)} ±{half / median:.0%}" if median else _fmt(median)


def _fmt_ratio(spread: dict[str, float] | None) -> str:
    if spread is None:
        return "-"
    return f"{spread['median']:.2f} [{spread['min']:.2f}-{spread['max']:.2f}]"
