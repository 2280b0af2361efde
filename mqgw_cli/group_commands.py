"""`mqgw cluster rebalance [--dry-run]`, `mqgw cluster drain-group GROUP` and `mqgw cluster
remove-group GROUP` (docs/elastic-queues.md), through a gateway's admin API (``--dir D``:
the local cluster's first gateway). Rebalance and drain show the plan, a line per partition
moved and a summary; remove-group refuses while the group holds partitions, and with ``--dir``
stops its brokers once the gateways retired it."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from rich.console import Console

from mqgw_cli.admin_client import AdminUnreachable, call, failure
from mqgw_cli.admin_target import AdminConfigError, AdminTarget, add_admin_options, admin_target

POLL_S = 0.5


def _console() -> Console:
    return Console(stderr=True, soft_wrap=True, highlight=False)


def _shares(console: Console, body: dict[str, Any]) -> None:
    groups = ", ".join(f"{g} {w}" for g, w in sorted(body["groups"].items()))
    console.print(f"shares: {groups} (largest {body['spread'] * 100:.0f} % above even)")


def _follow(console: Console, target: AdminTarget, timeout_s: float) -> int:
    """Print each move as it completes, then the summary; 1 if any failed or it timed out."""
    deadline = time.monotonic() + timeout_s
    shown = 0
    while True:
        got = call(target, "GET", "/api/cluster/moves")
        if got.status != 200:
            console.print(f"moves: {failure(target, got)}", markup=False)
            return 1
        job = got.body
        for move in job["moves"][shown : job["done"] + len(job["failed"])]:
            console.print(f"  {move['vhost']}/{move['queue']} partition {move['partition']}: "
                          f"{move['from']} → {move['to']}", markup=False)  # fmt: skip
        shown = job["done"] + len(job["failed"])
        if job["state"] == "finished":
            console.print(f"{job['kind']}: {job['done']} of {job['planned']} partition(s) moved "
                          f"in {job['seconds']:.1f} s ({job['partitions_per_minute']} per minute)"
                          + (f", {len(job['failed'])} failed" if job["failed"] else ""),
                          markup=False)  # fmt: skip
            for why in job["failed"]:
                console.print(f"  failed: {why}", markup=False)
            print(json.dumps(job))
            return 1 if job["failed"] else 0
        if time.monotonic() > deadline:
            console.print(f"{job['kind']}: still running after {timeout_s:g} s", markup=False)
            return 1
        time.sleep(POLL_S)


def rebalance(args: argparse.Namespace) -> int:
    console = _console()
    body = {"dry_run": args.dry_run, "tolerance": args.tolerance, "window_s": args.window,
            "per_minute": args.per_minute}  # fmt: skip
    try:
        target = admin_target(args)
        answer = call(target, "POST", "/api/cluster/rebalance", body)
        if answer.status not in (200, 202):
            console.print(f"mqgw cluster rebalance: {failure(target, answer)}", markup=False)
            return 1
        _shares(console, answer.body)
        planned = answer.body["moves"] if args.dry_run else answer.body["job"]["moves"]
        console.print(f"plan: {len(planned)} move(s)")
        for move in planned:
            console.print(f"  {move['vhost']}/{move['queue']} partition {move['partition']}: "
                          f"{move.get('source', move.get('from'))} → "
                          f"{move.get('target', move.get('to'))} (weight {move['weight']})",
                          markup=False)  # fmt: skip
        if args.dry_run:
            print(json.dumps(answer.body))
            return 0
        return _follow(console, target, args.timeout)
    except AdminConfigError as error:
        console.print(f"mqgw cluster rebalance: {error}", markup=False)
        return 2
    except AdminUnreachable as error:
        console.print(str(error), markup=False)
        return 1


def drain_group(args: argparse.Namespace) -> int:
    console = _console()
    try:
        target = admin_target(args)
        answer = call(target, "POST", f"/api/cluster/groups/{args.group}/drain",
                      {"per_minute": args.per_minute})  # fmt: skip
        if answer.status != 202:
            console.print(f"mqgw cluster drain-group: {failure(target, answer)}", markup=False)
            return 1
        console.print(f"drain {args.group}: {answer.body['job']['planned']} partition(s) to move")
        for stuck in answer.body["cannot_move"]:
            console.print(f"  cannot move: {stuck['why']}", markup=False)
        code = _follow(console, target, args.timeout)
        return 1 if answer.body["cannot_move"] else code
    except AdminConfigError as error:
        console.print(f"mqgw cluster drain-group: {error}", markup=False)
        return 2
    except AdminUnreachable as error:
        console.print(str(error), markup=False)
        return 1


def remove_group(args: argparse.Namespace) -> int:
    console = _console()
    try:
        target = admin_target(args)
        answer = call(target, "DELETE", f"/api/cluster/groups/{args.group}")
        if answer.status != 204:
            console.print(f"mqgw cluster remove-group: {failure(target, answer)}", markup=False)
            return 1
    except AdminConfigError as error:
        console.print(f"mqgw cluster remove-group: {error}", markup=False)
        return 2
    except AdminUnreachable as error:
        console.print(str(error), markup=False)
        return 1
    console.print(f"group {args.group} retired: nothing is placed there any more")
    if args.dir is not None:
        from localcluster import control
        from localcluster.layout import ClusterError

        try:
            stopped = control.remove_group(args.dir, args.group, args.timeout)
        except ClusterError as error:
            console.print(f"mqgw cluster remove-group: {error}", markup=False)
            return 1
        console.print("; ".join(f"{s.member.name}: {s.outcome}" for s in stopped), markup=False)
    return 0


def add_group_commands(cmds: Any) -> None:
    sub = cmds.add_parser("rebalance", help="move partitions until groups hold a fair share")
    sub.add_argument("--dry-run", action="store_true", help="show the plan only")
    sub.add_argument("--tolerance", type=float, default=0.1,
                     help="stop within this much of even (default 0.1)")  # fmt: skip
    sub.add_argument("--window", type=float, default=1.0, metavar="S",
                     help="seconds of traffic weighed (default 1)")  # fmt: skip
    sub.add_argument("--per-minute", type=float, default=60.0, metavar="N",
                     help="at most N moves a minute (default 60)")  # fmt: skip
    sub.add_argument("--timeout", type=float, default=3600.0, help="seconds to follow the job")
    add_admin_options(sub)
    sub.set_defaults(func=rebalance)
    sub = cmds.add_parser("drain-group", help="move every partition off a broker group")
    sub.add_argument("group", metavar="GROUP")
    sub.add_argument("--per-minute", type=float, default=60.0, metavar="N")
    sub.add_argument("--timeout", type=float, default=3600.0, help="seconds to follow the job")
    add_admin_options(sub)
    sub.set_defaults(func=drain_group)
    sub = cmds.add_parser("remove-group", help="retire an empty broker group")
    sub.add_argument("group", metavar="GROUP")
    sub.add_argument("--timeout", type=float, default=30.0, help="seconds its brokers have to stop")
    add_admin_options(sub)
    sub.set_defaults(func=remove_group)
