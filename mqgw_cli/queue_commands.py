"""`mqgw queue ...`: operator commands against a running gateway's admin API."""

from __future__ import annotations

import argparse
import json
import urllib.parse
from typing import Any

from rich.console import Console

from mqgw_cli.admin_client import DEFAULT_ADMIN_URL, AdminUnreachable, admin_call


def add_admin_options(parser: argparse.ArgumentParser) -> None:
    """--admin, --user, --password: where the admin API is and who calls it."""
    parser.add_argument("--admin", default=DEFAULT_ADMIN_URL, help="admin API base URL")
    parser.add_argument("--user", default="guest", help="admin user (default guest)")
    parser.add_argument("--password", default="guest", help="its password")


def redrive(args: argparse.Namespace) -> int:
    """Move messages from <queue>.dlq back to <queue>, a batch per call, with progress."""
    console = Console(stderr=True)
    vhost = urllib.parse.quote(args.vhost, safe="")
    queue = urllib.parse.quote(args.queue, safe="")
    path = f"/api/queues/{vhost}/{queue}/redrive?limit={args.batch}"
    total = 0
    try:
        while True:
            status, result = admin_call(args.admin, "POST", path, None, args.user, args.password)
            if status != 200:
                console.print(f"redrive failed: {status} {(result or {}).get('reason', '')}")
                return 1
            total += result["moved"]
            console.print(f"redrive {args.queue}: {total} moved, {result['remaining']} left")
            if result["moved"] == 0 or result["remaining"] == 0:
                break
    except AdminUnreachable as error:
        console.print(str(error))
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
        status, result = admin_call(
            args.admin, "POST", path, {"to": args.to}, args.user, args.password
        )
    except AdminUnreachable as error:
        console.print(str(error))
        return 1
    if status != 200:
        console.print(f"reset failed: {status} {(result or {}).get('reason', '')}")
        return 1
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
