"""`mqgw queue ...`: operator commands against a running gateway's admin API."""

from __future__ import annotations

import argparse
import json
import urllib.parse
from typing import Any

from rich.console import Console

from mqgw_cli.admin_client import AdminUnreachable, call, failure
from mqgw_cli.admin_target import AdminConfigError, add_admin_options, admin_target
from mqgw_cli.elastic_commands import add_elastic_commands
from mqgw_cli.rescale_commands import add_rescale_command

__all__ = ["add_admin_options", "add_queue_commands", "redrive", "reset"]


def redrive(args: argparse.Namespace) -> int:
    """Move messages from <queue>.dlq back to <queue>, a batch per call, with progress."""
    console = Console(stderr=True)
    vhost = urllib.parse.quote(args.vhost, safe="")
    queue = urllib.parse.quote(args.queue, safe="")
    path = f"/api/queues/{vhost}/{queue}/redrive?limit={args.batch}"
    total = 0
    try:
        target = admin_target(args)
        while True:
            answer = call(target, "POST", path)
            if answer.status != 200:
                console.print(f"redrive failed: {failure(target, answer)}", markup=False)
                return 1
            result = answer.body
            total += result["moved"]
            console.print(f"redrive {args.queue}: {total} moved, {result['remaining']} left")
            if result["moved"] == 0 or result["remaining"] == 0:
                break
    except AdminConfigError as error:
        console.print(f"mqgw queue redrive: {error}", markup=False)
        return 2
    except AdminUnreachable as error:
        console.print(str(error), markup=False)
        return 1
    print(json.dumps({"queue": args.queue, "vhost": args.vhost, "moved": total}))
    return 0


def reset(args: argparse.Namespace) -> int:
    """Move QUEUE's position to the first message stored at or after --to (ISO-8601 or ms
    since the epoch): prints how many messages that skips or replays."""
    console = Console(stderr=True)
    vhost = urllib.parse.quote(args.vhost, safe="")
    queue = urllib.parse.quote(args.queue, safe="")
    path = f"/api/queues/{vhost}/{queue}/reset"
    try:
        target = admin_target(args)
        answer = call(target, "POST", path, {"to": args.to})
    except AdminConfigError as error:
        console.print(f"mqgw queue reset: {error}", markup=False)
        return 2
    except AdminUnreachable as error:
        console.print(str(error), markup=False)
        return 1
    if answer.status != 200:
        console.print(f"reset failed: {failure(target, answer)}", markup=False)
        return 1
    result = answer.body
    console.print(
        f"reset {args.queue} to {args.to}: {result['skipped']} skipped, "
        f"{result['replayed']} replayed, {result['messages_ready']} ready"
    )
    print(json.dumps(result))
    return 0


def add_queue_commands(commands: Any) -> None:
    queue = commands.add_parser("queue", help="operate on a running gateway's queues")
    queue_cmds = queue.add_subparsers(dest="command", required=True)
    sub = queue_cmds.add_parser(
        "redrive", help="move dead-lettered messages from QUEUE.dlq back to QUEUE"
    )
    sub.add_argument("queue")
    sub.add_argument("--vhost", default="/")
    add_admin_options(sub)
    sub.add_argument("--batch", type=int, default=10_000, help="messages per call")
    sub.set_defaults(func=redrive)
    sub = queue_cmds.add_parser(
        "reset", help="read QUEUE again from a time (skips or replays messages)"
    )
    sub.add_argument("queue")
    sub.add_argument("--to", required=True, help="ISO-8601 time (UTC if no zone) or ms")
    sub.add_argument("--vhost", default="/")
    add_admin_options(sub)
    sub.set_defaults(func=reset)
    add_rescale_command(queue_cmds)
    add_elastic_commands(queue_cmds)
