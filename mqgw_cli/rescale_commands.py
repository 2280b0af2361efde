"""`mqgw queue rescale QUEUE --split P [--at L] | --merge P,Q | --move P [--to GROUP] |
--partitions N [--wait]`: rescale a keyed-order queue (docs/ordering.md) through the admin
API, showing each step's progress until every consumer is on the new version (``--wait``)."""

from __future__ import annotations

import argparse
from typing import Any

from mqgw_cli.admin_target import add_admin_options
from mqgw_cli.elastic_commands import follow_change

POLL_S = 0.2


def body_of(args: argparse.Namespace) -> dict[str, Any]:
    if args.split is not None:
        body: dict[str, Any] = {"split": args.split}
        if args.at is not None:
            body["at"] = args.at
        return body
    if args.merge is not None:
        return {"merge": args.merge}
    if args.move is not None:
        return {"move": args.move, "to": args.to or ""}
    return {"partitions": args.partitions}


def describe(route: dict[str, Any]) -> str:
    """One line: the version, its change, and what is still draining."""
    latest = route["versions"][-1]
    draining = [
        f"partition {p['partition']} {p['state']} ({p['held'] + p['unacked']} to go)"
        for p in route["partitions"]
        if p["state"] in ("closing", "draining")
    ]
    waiting = ", ".join(draining) if draining else "complete"
    return (f"version {route['version']} ({latest['change']}), {route['open_partitions']} "
            f"partitions open: {waiting}")  # fmt: skip


def _summary(queue: str, route: dict[str, Any], took: float | None) -> str:
    ranges = ", ".join(f"{p['partition']}:[{p['range'][0]},{p['range'][1]})"
                       for p in route["partitions"] if p["range"] is not None)  # fmt: skip
    after = "" if took is None else f", in {took:.2f} s"
    return f"{queue}: route version {route['version']}, partitions {ranges}{after}"


def rescale(args: argparse.Namespace) -> int:
    return follow_change(args, "rescale", "rescale", body_of(args), describe, _summary)


def add_rescale_command(queue_cmds: Any) -> None:
    sub = queue_cmds.add_parser(
        "rescale", help="split, merge or move a keyed-order queue's partitions"
    )
    sub.add_argument("queue", metavar="QUEUE")
    step = sub.add_mutually_exclusive_group(required=True)
    step.add_argument("--split", type=int, metavar="P", help="split partition P in two")
    step.add_argument("--merge", metavar="P,Q", help="merge two partitions of adjacent ranges")
    step.add_argument("--move", type=int, metavar="P", help="move partition P (see --to)")
    step.add_argument("--partitions", type=int, metavar="N",
                      help="split or merge, one step at a time, to N partitions")  # fmt: skip
    sub.add_argument("--at", type=int, metavar="L", help="--split before logical partition L")
    sub.add_argument("--to", metavar="GROUP", help="--move to this broker group")
    sub.add_argument("--wait", action="store_true",
                     help="wait until every consumer is on the new version")  # fmt: skip
    sub.add_argument("--timeout", type=float, default=300.0, help="seconds --wait waits")
    sub.add_argument("--vhost", default="/")
    add_admin_options(sub)
    sub.set_defaults(func=rescale)
