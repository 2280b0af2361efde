"""`mqgw sim nemesis`: faults on real hosts (network namespaces), checked like Jepsen's queue
checker (localcluster/nemesis/).

    mqgw sim nemesis --seed S --minutes M [--dir D]
    mqgw sim nemesis-summary REPORT [REPORT...]

Builds ten hosts on a private bridge (Redis, its replica and three sentinels, two controllers,
a broker group of three, two gateways), runs publishers and consumers through both gateways,
applies the faults seed S gives for M minutes (each logged with its time), heals, drains the
queues and checks the history. Needs root (``ip netns``). Exit 1 if the check failed; the
report names the seed, the fault timeline and the messages concerned.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

PROG = "mqgw sim nemesis"


def _nemesis(args: argparse.Namespace) -> int:
    from localcluster.nemesis.run import run

    if args.minutes <= 0:
        print(f"{PROG}: --minutes must be positive", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print(f"{PROG}: needs root, to make network namespaces (ip netns)", file=sys.stderr)
        return 2
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="mqgw-nemesis-"))
    root.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for client in ("pika", "aiormq", "aio_pika"):  # reconnects: counted in the report
        logging.getLogger(client).setLevel(logging.CRITICAL)
    report = run(args.seed, args.minutes, root)
    print(report.describe())
    print(f"logs: {root / 'logs'}")
    return 0 if report.ok else 1


def _summary(args: argparse.Namespace) -> int:
    from localcluster.nemesis.summary import parse, table

    runs = []
    for name in args.reports:
        try:
            run = parse(Path(name).read_text(errors="replace"))
        except OSError as error:
            print(f"{PROG}-summary: cannot read {name}: {error.strerror}", file=sys.stderr)
            return 2
        if run is None:
            print(f"{PROG}-summary: {name}: no finished run's report in it", file=sys.stderr)
            return 2
        runs.append(run)
    print(table(runs))
    return 0 if all(run.clean for run in runs) else 1


def add_nemesis_command(sims: Any) -> None:
    nemesis = sims.add_parser(
        "nemesis",
        help="faults on real hosts (network namespaces), checked like Jepsen's queue checker",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    nemesis.add_argument("--seed", type=int, default=0, help="the fault schedule's seed")
    nemesis.add_argument("--minutes", type=float, default=2.0, help="how long faults go on")
    nemesis.add_argument("--dir", default=None, help="where data and logs go (default: a temp dir)")
    nemesis.set_defaults(func=_nemesis, configures_logging=True)
    summary = sims.add_parser(
        "nemesis-summary",
        help="many nemesis runs' reports in one table: clean runs, confirm gaps per fault kind",
    )
    summary.add_argument("reports", nargs="+", help="files holding what `sim nemesis` printed")
    summary.set_defaults(func=_summary)
