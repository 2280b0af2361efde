"""`mqgw rocketmq up|status|down --dir D`: a local RocketMQ for tests and newcomers.

    mqgw rocketmq up --dir D [--replicas 2] [--timeout S]
    mqgw rocketmq status --dir D [--json]
    mqgw rocketmq down --dir D [--purge] [--timeout S]
    mqgw rocketmq fetch

`up` starts the pinned RocketMQ release (fetched from Maven Central into the cache once) as
local JVMs on free loopback ports: a name server and one broker, or with --replicas 2 a
controller and a master and a slave that fail over. D/rocketmq.json describes them; they keep
running after `up` returns. docs/rocketmq.md has the details. Exit codes: 0 done (status: all
running), 1 failed (status: something is down), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _print(text: str) -> None:
    print(text, flush=True)


def _up(args: argparse.Namespace) -> int:
    from localcluster.rocketmq import local
    from localcluster.rocketmq.layout import STATE_FILE, RocketMQError

    if args.replicas < 1:
        print("mqgw rocketmq up: --replicas must be ≥ 1", file=sys.stderr)
        return 2
    try:
        layout = local.up(args.dir, args.replicas, args.timeout, _print)
    except RocketMQError as error:
        print(f"mqgw rocketmq up: {error}", file=sys.stderr)
        return 1
    _print(f"\nRocketMQ {layout.version} in {layout.dir} ({layout.dir / STATE_FILE}):")
    for process in layout.processes:
        ports = " ".join(f"{k}={v}" for k, v in process.ports.items())
        _print(f"  {process.name:<9} pid {process.pid:<8} {ports:<34} {process.log}")
    _print(f"name server: {layout.namesrv.address}")
    if layout.controller:
        _print(f"controller:  {layout.controller}")
    _print(f"stop with:   mqgw rocketmq down --dir {args.dir}")
    return 0


def _status(args: argparse.Namespace) -> int:
    from localcluster.rocketmq import local
    from localcluster.rocketmq.layout import RocketMQError

    try:
        layout, statuses = local.status(args.dir)
    except RocketMQError as error:
        print(f"mqgw rocketmq status: {error}", file=sys.stderr)
        return 1
    healthy = all(s.alive for s in statuses)
    if args.json:
        rows: list[dict[str, Any]] = [
            {**s.process.to_json(), "alive": s.alive, "state": s.state} for s in statuses
        ]
        _print(json.dumps({"namesrv": layout.namesrv.address, "processes": rows}, indent=2))
        return 0 if healthy else 1
    _print(f"RocketMQ {layout.version} in {layout.dir}, name server {layout.namesrv.address}")
    for s in statuses:
        ports = " ".join(f"{k}={v}" for k, v in s.process.ports.items())
        pid = s.process.pid if s.alive else "-"
        _print(f"  {s.process.name:<9} pid {pid!s:<8} {ports:<34} {s.state}")
    return 0 if healthy else 1


def _down(args: argparse.Namespace) -> int:
    from localcluster.rocketmq import local
    from localcluster.rocketmq.layout import STATE_FILE, RocketMQError

    try:
        outcome = local.down(args.dir, args.timeout, args.purge)
    except RocketMQError as error:
        print(f"mqgw rocketmq down: {error}", file=sys.stderr)
        return 1
    if not outcome:
        _print(f"no RocketMQ in {args.dir} ({STATE_FILE} is missing): nothing to stop")
        return 0  # teardown scripts call down unconditionally
    for name, what in outcome.items():
        _print(f"  {name:<9} {what}")
    if args.purge and not (args.dir / STATE_FILE).exists():
        _print(f"removed its files from {args.dir}")
    return 0 if "ALIVE" not in outcome.values() else 1


def _fetch(args: argparse.Namespace) -> int:
    from localcluster.rocketmq import dist

    return dist.main()


def add_rocketmq_commands(commands: Any) -> None:
    rocketmq = commands.add_parser(
        "rocketmq",
        help="a local RocketMQ (name server, broker group) for tests (D/rocketmq.json)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    cmds = rocketmq.add_subparsers(dest="command", required=True)

    def sub(name: str, text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = cmds.add_parser(name, help=text, description=text)
        parser.add_argument("--dir", type=Path, required=True, metavar="D", help="its directory")
        return parser

    up = sub("up", "start a name server and a broker group; wait until they serve")
    up.add_argument(
        "--replicas",
        type=int,
        default=1,
        metavar="N",
        help="brokers in the group (default 1); 2: master and slave with a controller",
    )
    up.add_argument(
        "--timeout", type=float, default=120.0, metavar="S", help="for it all (default 120)"
    )
    up.set_defaults(func=_up)

    status = sub("status", "each process: pid, ports, running? role? (exit 1 if any is down)")
    status.add_argument("--json", action="store_true", help="JSON for machines")
    status.set_defaults(func=_status)

    down = sub("down", "stop every process (SIGTERM, then SIGKILL); data stays unless --purge")
    down.add_argument("--purge", action="store_true", help="also remove its data and files")
    down.add_argument(
        "--timeout", type=float, default=30.0, metavar="S", help="before SIGKILL (default 30)"
    )
    down.set_defaults(func=_down)

    fetch = cmds.add_parser(
        "fetch", help="fetch the pinned release into the cache (if needed); print its lib dir"
    )
    fetch.set_defaults(func=_fetch)
