"""Many nemesis runs in one table: how many were clean, which faults they injected, the
longest time without a confirm around each kind of fault (median, p99, max) over all runs,
and the longest time in which no controller could decide (median, max: what the fault cost
in failover capability; runs from before that was reported have no figure).

Reads the reports `mqgw sim nemesis` prints (one file per run, as the campaign keeps them):
the verdict line and every fault line, "t= 9.69s lossy   r2 (...) for 4.91s; longest confirm
gap 0.04s; no controller deciding 0.00s". Pure: text in, table out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

FAULT = re.compile(
    r"^\s+t=\s*[\d.]+s (\w+)\s+.*; longest confirm gap ([\d.]+)s"
    r"(?:; no controller deciding ([\d.]+)s)?$"
)
# A history that checks clean fails the run all the same with one of these (run.py).
FAILS = ("  CRASHED: ", "  MASTERS: ", "the queues did not drain")
HEAD = re.compile(r"^nemesis seed (-?\d+), ([\d.]+) min, (\d+) faults$")


@dataclass
class Run:
    seed: int
    minutes: float
    clean: bool
    stalls: dict[str, list[float]] = field(default_factory=dict)
    blind: dict[str, list[float]] = field(default_factory=dict)


def parse(text: str) -> Run | None:
    """One run's report (None: the text holds none, e.g. a run that did not finish)."""
    run: Run | None = None
    failed = False
    for line in text.splitlines():
        if (head := HEAD.match(line)) is not None:
            run = Run(int(head[1]), float(head[2]), clean=False)
        elif run is not None and (fault := FAULT.match(line)) is not None:
            run.stalls.setdefault(fault[1], []).append(float(fault[2]))
            if fault[3] is not None:
                run.blind.setdefault(fault[1], []).append(float(fault[3]))
        elif run is not None and line.startswith("published ") and line.endswith(": clean"):
            run.clean = True
        elif run is not None and any(mark in line for mark in FAILS):
            failed = True
    if run is not None and failed:
        run.clean = False
    return run


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile (``share`` in 0..1) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * share // 1))
    return ordered[int(rank) - 1]


def table(runs: Iterable[Run]) -> str:
    every = list(runs)
    failed = [str(r.seed) for r in every if not r.clean]
    verdict = f", FAILED: seeds {', '.join(failed)}" if failed else ""
    minutes = sum(r.minutes for r in every)
    lines = [
        f"{len(every)} runs, {minutes:g} minutes of faults: {len(every) - len(failed)} clean"
        + verdict,
        "| fault | injected | confirm gap median | p99 | max | no controller deciding median "
        "| max |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind in sorted({kind for r in every for kind in r.stalls}):
        stalls = [s for r in every for s in r.stalls.get(kind, [])]
        blind = [s for r in every for s in r.blind.get(kind, [])]
        deciding = f"{percentile(blind, 0.5):.2f} s | {max(blind):.2f} s" if blind else "— | —"
        lines.append(
            f"| {kind} | {len(stalls)} | {percentile(stalls, 0.5):.2f} s | "
            f"{percentile(stalls, 0.99):.2f} s | {max(stalls):.2f} s | {deciding} |"
        )
    return "\n".join(lines)
