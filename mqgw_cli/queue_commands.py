"""`mqgw queue ...`: operator commands against a running gateway's admin API."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from rich.console import Console


def _call(base: str, method: str, path: str) -> Any:
    request = urllib.request.Request(base.rstrip("/") + path, method=method)
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read() or b"null")


def redrive(args: argparse.Namespace) -> int:
    """Move messages from <queue>.dlq back to <queue>, a batch per call, with progress."""
    console = Console(stderr=True)
    vhost = urllib.parse.quote(args.vhost, safe="")
    queue = urllib.parse.quote(args.queue, safe="")
    path = f"/api/queues/{vhost}/{queue}/redrive?limit={args.batch}"
    total = 0
    try:
        while True:
            result = _call(args.admin, "POST", path)
            total += result["moved"]
            console.print(f"redrive {args.queue}: {total} moved, {result['remaining']} left")
            if result["moved"] == 0 or result["remaining"] == 0:
                break
    except urllib.error.HTTPError as error:
        console.print(f"redrive failed: {error.code} {error.read().decode(errors='replace')}")
        return 1
    except urllib.error.URLError as error:
        console.print(f"cannot reach the admin API at {args.admin}: {error.reason}")
        return 1
    print(json.dumps({"queue": args.queue, "vhost": args.vhost, "moved": total}))
    return 0


def add_queue_commands(commands: Any) -> None:
    queue = commands.add_parser("queue", help="operate on a running gateway's queues")
    queue_cmds = queue.add_subparsers(dest="command", required=True)
    sub = queue_cmds.add_parser(
        "redrive", help="move dead-lettered messages from QUEUE.dlq back to QUEUE"
    )
    sub.add_argument("queue")
    sub.add_argument("--vhost", default="/")
    sub.add_argument("--admin", default="http://127.0.0.1:15672", help="admin API base URL")
    sub.add_argument("--batch", type=int, default=10_000, help="messages per call")
    sub.set_defaults(func=redrive)
