"""`mqgw queue scale QUEUE --partitions N` and `mqgw queue move QUEUE [--partition P] --to
GROUP` (docs/elastic-queues.md) through the admin API: the change, then a line each time its
progress moves (partitions opening, closing, draining with what they still hold) until it
completes, and a summary with the time it took. ``--no-wait`` returns once it began."""

from __future__ import annotations

import argparse
import json
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from rich.console import Console

from mqgw_cli.admin_client import AdminUnreachable, call, failure
from mqgw_cli.admin_target import AdminConfigError, add_admin_options, admin_target

POLL_S = 0.2


def describe(route: dict[str, Any]) -> str:
    """One line: the version, its change, and what is still to happen."""
    latest = route["versions"][-1]
    moving = [
        f"partition {p['partition']} {p['state']}"
        + (f" ({p['held'] + p['unacked']} held here)" if p["state"] == "draining" else "")
        for p in route["partitions"]
        if p["state"] in ("opening", "closing", "draining")
    ]
    target = route.get("target_partitions")
    waiting = ", ".join(moving) if moving else "complete"
    if not moving and target is not None:
        waiting = f"on the way to {target}"
    return (f"version {route['version']} ({latest['change']}), {route['open_partitions']} "
            f"partitions open: {waiting}")  # fmt: skip


def _done(route: dict[str, Any]) -> bool:
    return route["in_progress"] is None and route.get("target_partitions") is None


Describe = Callable[[dict[str, Any]], str]
Summary = Callable[[str, dict[str, Any], float | None], str]


def _summary(queue: str, route: dict[str, Any], took: float | None) -> str:
    after = " (begun)" if took is None else f" in {took:.2f} s"
    return (
        f"{queue}: route version {route['version']}, {route['open_partitions']} "
        f"partitions open{after}"
    )


def follow_change(
    args: argparse.Namespace, what: str, path: str, body: dict[str, Any],
    describe_route: Describe = describe, summary: Summary = _summary,
) -> int:  # fmt: skip
    """POST the change, then (``args.wait``) a line each time its progress moves until it
    completes, a summary, and the route as JSON on stdout."""
    console = Console(stderr=True, soft_wrap=True)
    vhost = urllib.parse.quote(args.vhost, safe="")
    queue = urllib.parse.quote(args.queue, safe="")
    started = time.monotonic()
    try:
        target = admin_target(args)
        answer = call(target, "POST", f"/api/queues/{vhost}/{queue}/{path}", body)
        if answer.status not in (200, 202):
            console.print(f"mqgw queue {what}: {failure(target, answer)}", markup=False)
            return 1
        route = answer.body["route"]
        shown = describe_route(route)
        console.print(f"{args.queue}: {shown}", markup=False)
        deadline = started + args.timeout
        while args.wait and not _done(route):
            if time.monotonic() > deadline:
                console.print(f"{args.queue}: not complete after {args.timeout:g} s", markup=False)
                print(json.dumps(route))
                return 1
            time.sleep(POLL_S)
            got = call(target, "GET", f"/api/queues/{vhost}/{queue}/route")
            if got.status != 200:
                console.print(f"mqgw queue {what}: {failure(target, got)}", markup=False)
                return 1
            route = got.body
            line = describe_route(route)
            if line != shown:
                console.print(f"{args.queue}: {line}", markup=False)
                shown = line
    except AdminConfigError as error:
        console.print(f"mqgw queue {what}: {error}", markup=False)
        return 2
    except AdminUnreachable as error:
        console.print(str(error), markup=False)
        return 1
    took = time.monotonic() - started if args.wait else None
    console.print(summary(args.queue, route, took), markup=False)
    print(json.dumps(route))
    return 0


def scale(args: argparse.Namespace) -> int:
    return follow_change(args, "scale", "scale", {"partitions": args.partitions})


def move(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"to": args.to}
    if args.partition is not None:
        body["partition"] = args.partition
    return follow_change(args, "move", "move", body)


def _common(sub: Any) -> None:
    sub.add_argument("--no-wait", dest="wait", action="store_false",
                     help="return once the change began")  # fmt: skip
    sub.add_argument("--timeout", type=float, default=300.0, help="seconds to wait")
    sub.add_argument("--vhost", default="/")
    add_admin_options(sub)


def add_elastic_commands(queue_cmds: Any) -> None:
    sub = queue_cmds.add_parser("scale", help="grow or shrink a queue to N partitions")
    sub.add_argument("queue", metavar="QUEUE")
    sub.add_argument("--partitions", type=int, required=True, metavar="N")
    _common(sub)
    sub.set_defaults(func=scale)
    sub = queue_cmds.add_parser("move", help="move a queue's partitions to a broker group")
    sub.add_argument("queue", metavar="QUEUE")
    sub.add_argument("--partition", type=int, metavar="P",
                     help="this one only (a plain queue: all not on GROUP)")  # fmt: skip
    sub.add_argument("--to", required=True, metavar="GROUP")
    _common(sub)
    sub.set_defaults(func=move)
