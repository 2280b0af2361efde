"""`mqgw sim failover`: the deterministic failover simulation (docs/controller.md).

    mqgw sim failover [--seeds N] [--seed S] [--steps K] [--jobs J] [--trace]

Runs seeds S .. S+N-1 (N defaults to 1, S to 0), each for at most K events, on J worker
processes, with a progress line; prints a summary (seeds per minute, failover times) and,
for each failing seed, the invariant it broke and the command that replays it. Exit 1 if
any seed failed. --trace (one seed): print what happened in it, line by line.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def _failover(args: argparse.Namespace) -> int:
    from controller.sim.run import SeedResult, default_jobs, reproducer, run_seeds

    if args.seeds < 1 or args.steps < 1:
        print("mqgw sim failover: --seeds and --steps must be positive", file=sys.stderr)
        return 2
    if args.trace:
        return _trace(args.seed, args.steps)
    seeds = range(args.seed, args.seed + args.seeds)
    jobs = min(args.jobs or default_jobs(), args.seeds)
    started = time.monotonic()
    failed: list[SeedResult] = []
    failovers: list[int] = []
    steps = 0
    tty = sys.stderr.isatty()
    for done, result in enumerate(run_seeds(seeds, args.steps, jobs), start=1):
        steps += result.steps
        failovers += result.failovers
        if not result.ok:
            failed.append(result)
            print(f"\nseed {result.seed} FAILED: {result.failure}", file=sys.stderr)
            print(f"  reproduce: {reproducer(result.seed, args.steps)}", file=sys.stderr)
        if tty or done == len(seeds) or done % 100 == 0:
            elapsed = time.monotonic() - started
            line = (f"{done}/{len(seeds)} seeds, {len(failed)} failed, "
                    f"{done / elapsed * 60:.0f} seeds/min")  # fmt: skip
            print(("\r" if tty else "") + line, end="" if tty else "\n", file=sys.stderr)
    elapsed = time.monotonic() - started
    if tty:
        print(file=sys.stderr)
    _summary(len(seeds), failed, steps, elapsed, failovers, jobs)
    return 1 if failed else 0


def _trace(seed: int, steps: int) -> int:
    from controller.sim.run import run_seed

    lines: list[str] = []
    result = run_seed(seed, steps, lines)
    print("\n".join(lines))
    return 0 if result.ok else 1


def _summary(
    seeds: int, failed: list[Any], steps: int, elapsed: float, failovers: list[int], jobs: int
) -> None:
    print(
        f"{seeds} seeds, {len(failed)} failed, in {elapsed:.1f} s on {jobs} process(es): "
        f"{seeds / elapsed * 60:.0f} seeds/min, {steps / elapsed:.0f} steps/s"
    )
    if failovers:
        ordered = sorted(failovers)
        print(
            f"master kill -> next confirm (simulated, {len(ordered)} drills): "
            f"p50 {ordered[len(ordered) // 2]} ms, max {ordered[-1]} ms"
        )
    for result in failed:
        print(f"seed {result.seed}: {result.invariant}")


def add_sim_commands(commands: Any) -> None:
    from controller.sim import DEFAULT_STEPS
    from mqgw_cli.nemesis_command import add_nemesis_command

    sim = commands.add_parser("sim", help="deterministic simulations")
    sims = sim.add_subparsers(dest="command", required=True)
    failover = sims.add_parser(
        "failover",
        help="the controller and replication against a faulty simulated cluster",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    failover.add_argument("--seeds", type=int, default=1, help="how many seeds (default 1)")
    failover.add_argument("--seed", type=int, default=0, help="the first seed (default 0)")
    failover.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help=f"events per seed (default {DEFAULT_STEPS})",
    )
    failover.add_argument(
        "--jobs", type=int, default=0, help="worker processes (default: one per CPU)"
    )
    failover.add_argument(
        "--trace", action="store_true", help="print what happens in seed --seed, line by line"
    )
    failover.set_defaults(func=_failover)
    add_nemesis_command(sims)
