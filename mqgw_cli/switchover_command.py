"""`mqgw ctl switchover GROUP --meta URL [--to ID]`: a planned change of a replicated group's
master (the leading controller fences the master, waits until the target holds its whole log,
then elects the target; docs/replication.md). Waits for the new master and prints how long
the switch took; exit 1 if it did not happen within --timeout (the controller lifts the fence
after its switchover timeout: the old master confirms again).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def run_switchover(args: argparse.Namespace) -> int:
    import anyio

    return anyio.run(_switchover, args)


async def _switchover(args: argparse.Namespace) -> int:
    import anyio
    from redis.asyncio import Redis

    from controller.redis_link import GroupLink

    client: Redis = Redis.from_url(
        args.meta, decode_responses=True, protocol=2, socket_connect_timeout=2.0
    )
    try:
        link = GroupLink(client)
        before = await link.record(args.group)
        if not before.master:
            print(f"mqgw ctl switchover: group {args.group} has no master", file=sys.stderr)
            return 2
        if args.to and args.to not in before.in_sync - {before.master}:
            print(
                f"mqgw ctl switchover: {args.to} is not an in-sync replica of {args.group} "
                f"(in sync: {', '.join(sorted(before.in_sync))})",
                file=sys.stderr,
            )
            return 2
        started = time.monotonic()
        await link.request_switchover(args.group, args.to or "")
        deadline = started + args.timeout
        while time.monotonic() < deadline:
            record = await link.record(args.group)
            if record.epoch > before.epoch and record.master != before.master:
                took = time.monotonic() - started
                print(
                    f"group {args.group}: master {before.master} -> {record.master} "
                    f"at epoch {record.epoch} in {took:.2f} s"
                )
                return 0
            await anyio.sleep(0.02)
        print(
            f"mqgw ctl switchover: group {args.group} still has master {before.master} after "
            f"{args.timeout:g} s (is a controller running? is a replica in sync?)",
            file=sys.stderr,
        )
        return 1
    finally:
        await client.aclose()


def add_switchover_command(actions: Any) -> None:
    switchover = actions.add_parser(
        "switchover", help="move a replicated group's master to an in-sync replica (planned)"
    )
    switchover.add_argument("group", metavar="GROUP")
    switchover.add_argument("--meta", required=True, metavar="URL", help="redis://H:P/N")
    switchover.add_argument("--to", default="", metavar="ID", help="target (default: the best)")
    switchover.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    switchover.set_defaults(func=run_switchover)
