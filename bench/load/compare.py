"""`mqgw bench run` and `mqgw bench compare`: scenarios against one target, or A/B alternately.

Each run prints one JSON line on stdout. A comparison alternates A and B within every round
(so drift hits both alike), then prints per scenario the median ratio A/B and its spread, as
JSON lines and a table. ``--with-rabbitmq`` starts both servers itself: the gateway with sync
flush (group-commit fsync before confirm) against RabbitMQ with persistent messages in durable
classic queues (confirms after fsync) — the fair match.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.load.connection import RawConnection, ServerClosed
from bench.load.measure import run_scenario
from bench.load.runner import OUTSIDE_POLICY, Target, console
from bench.load.scenarios import SCENARIOS, Scenario
from bench.load.sides import gateway_target, rabbitmq_target


def pick(names: list[str]) -> list[Scenario]:
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    return [SCENARIOS[n] for n in names] if names else list(SCENARIOS.values())


def run_one(scenario: Scenario, target: Target, scale: float, procs: int) -> dict[str, Any]:
    try:
        result = run_scenario(scenario, target, scale, procs)
    except Exception as error:  # report and go on: one broken scenario must not end the run
        result = {"scenario": scenario.name, "target": target.label, "error": str(error)}
    print(json.dumps(result), flush=True)
    return result


def url_target(spec: str, prefix: str = "") -> Target:
    """A target from one AMQP URL, or from several separated by commas (one system's entry
    points, e.g. a cluster's gateways: publishers and consumers are spread over them)."""
    urls = [u.strip() for u in spec.split(",") if u.strip()]
    if not urls:
        raise SystemExit(f"no AMQP URL in {spec!r}")
    hosts = "+".join(u.rsplit("@", maxsplit=1)[-1] for u in urls)
    return Target(
        urls[0], prefix + hosts, outside_policy(urls[0]), urls=tuple(urls) if len(urls) > 1 else ()
    )


def outside_policy(url: str) -> str:
    """What is known of a server the bench did not start: not its flush policy (neither AMQP
    nor the admin API says it), but what it is, as its connection.start says."""
    try:
        connection = RawConnection(url, timeout_s=5.0)
    except (OSError, ServerClosed, TimeoutError, ValueError):
        return OUTSIDE_POLICY  # the run itself reports why it cannot connect
    try:
        said = connection.server_properties
    finally:
        connection.close()
    product = " ".join(str(said[key]) for key in ("product", "version") if said.get(key))
    return f"{OUTSIDE_POLICY} (its connection.start says {product})" if product else OUTSIDE_POLICY


def run(names: list[str], url: str | None, scale: float, procs: int) -> None:
    scenarios = pick(names)
    with contextlib.ExitStack() as stack:
        if url is None:  # no URL: the bench starts a gateway (sync flush) for itself
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mqgw-bench-")))
            target = stack.enter_context(gateway_target(root))
        else:
            target = url_target(url)
        for scenario in scenarios:
            run_one(scenario, target, scale, procs)


def compare(
    names: list[str], urls: list[str] | None, scale: float, rounds: int, procs: int
) -> list[dict[str, Any]]:
    scenarios = pick(names)
    with contextlib.ExitStack() as stack:
        if urls is None:
            root = Path(tempfile.mkdtemp(prefix="mqgw-bench-"))
            stack.callback(shutil.rmtree, root, ignore_errors=True)
            a = stack.enter_context(gateway_target(root))
            b = stack.enter_context(rabbitmq_target(root))
        else:
            a, b = (url_target(u, f"{tag}:") for tag, u in zip("AB", urls, strict=True))
        console.print(f"A = {a.label} ({a.policy})\nB = {b.label} ({b.policy})")
        results: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {}
        for round_no in range(rounds):
            for scenario in scenarios:
                console.print(f"round {round_no + 1}/{rounds}: {scenario.name}")
                pair = (run_one(scenario, a, scale, procs), run_one(scenario, b, scale, procs))
                results.setdefault(scenario.name, []).append(pair)
    summaries = [_ratios(SCENARIOS[name], pairs, a, b) for name, pairs in results.items()]
    for summary in summaries:
        print(json.dumps(summary), flush=True)
    _table(summaries, a, b)
    return summaries


def _ratios(
    scenario: Scenario, pairs: list[tuple[dict[str, Any], dict[str, Any]]], a: Target, b: Target
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "summary": scenario.name,
        "a": a.label,
        "b": b.label,
        "a_policy": a.policy,
        "b_policy": b.policy,
        "rounds": len(pairs),
        "errors": sum(1 for pa, pb in pairs for r in (pa, pb) if "error" in r),
        "a_lost": sum(r.get("lost", 0) for r, _ in pairs),
        "a_duplicated": sum(r.get("duplicated", 0) for r, _ in pairs),
        "b_lost": sum(r.get("lost", 0) for _, r in pairs),
        "b_duplicated": sum(r.get("duplicated", 0) for _, r in pairs),
    }
    for field in scenario.ratio_fields:
        ratios = [
            pa[field] / pb[field]
            for pa, pb in pairs
            if isinstance(pa.get(field), int | float) and isinstance(pb.get(field), int | float)
            if pb[field]
        ]
        out[f"{field}_ratio"] = (
            {
                "median": round(statistics.median(ratios), 3),
                "min": round(min(ratios), 3),
                "max": round(max(ratios), 3),
            }
            if ratios
            else None
        )
        values_a = [pa[field] for pa, _ in pairs if isinstance(pa.get(field), int | float)]
        values_b = [pb[field] for _, pb in pairs if isinstance(pb.get(field), int | float)]
        out[f"a_{field}"] = statistics.median(values_a) if values_a else None
        out[f"b_{field}"] = statistics.median(values_b) if values_b else None
    return out


def _table(summaries: list[dict[str, Any]], a: Target, b: Target) -> None:
    table = Table(title=f"A/B: A = {a.label}, B = {b.label} (median ratio A/B [min-max])")
    for col in ("scenario", "figure", "A", "B", "A/B", "lost/dup A", "lost/dup B"):
        table.add_column(col, justify="right")
    for summary in summaries:
        fields = [k[: -len("_ratio")] for k in summary if k.endswith("_ratio")]
        for i, field in enumerate(fields):
            ratio = summary[f"{field}_ratio"]
            table.add_row(
                summary["summary"] if i == 0 else "",
                field,
                _fmt(summary[f"a_{field}"]),
                _fmt(summary[f"b_{field}"]),
                f"{ratio['median']:.2f} [{ratio['min']:.2f}-{ratio['max']:.2f}]" if ratio else "-",
                f"{summary['a_lost']}/{summary['a_duplicated']}" if i == 0 else "",
                f"{summary['b_lost']}/{summary['b_duplicated']}" if i == 0 else "",
            )
    # Not a terminal (piped to a file): rich would wrap the table at 80 columns.
    out = console if console.is_terminal else Console(stderr=True, width=140)
    out.print(table)
    out.print(f"A: {a.policy}\nB: {b.policy}")


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"
