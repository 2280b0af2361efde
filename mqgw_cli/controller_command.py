"""`mqgw controller`: decide which broker of each group is master (docs/controller.md).

    mqgw controller --meta redis://H:P/N [--name N] [timing flags]

Several may run against one Redis; one leads (a lease with a fencing token), the others wait
to take over. Logs leadership changes and every decision. SIGTERM or SIGINT: give the lease
up and exit 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from dataclasses import fields
from typing import Any

log = logging.getLogger("mqgw.controller")

_TIMING_FLAGS = {
    "heartbeat_interval_ms": "how often brokers heartbeat (default 200)",
    "master_timeout_ms": "a master stops confirming this long after its last answer (1500)",
    "safety_margin_ms": "added to the master timeout before an election (500)",
    "broker_timeout_ms": "a slave silent this long leaves the in-sync set (1500)",
    "lease_ms": "the leader lease (2000)",
    "tick_ms": "how often the controller reads Redis and decides (100)",
    "switchover_timeout_ms": "a switchover not done by then is called off (2000)",
    "min_in_sync": "replicas, master included, below which appends are refused (1)",
}


def _controller(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from controller.service import serve
    from meta.groups.timing import ConfigError, ControllerConfig

    defaults = {f.name: f.default for f in fields(ControllerConfig)}
    chosen = {k: getattr(args, k) for k in _TIMING_FLAGS if getattr(args, k) is not None}
    try:
        config = ControllerConfig(
            **{**defaults, **chosen, "unclean_election": args.unclean_election}
        ).check()
    except ConfigError as error:
        print(f"mqgw controller: {error}", file=sys.stderr)
        return 2
    name = args.name or f"{socket.gethostname()}-{os.getpid()}"

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(args.meta, name, config, stop)

    asyncio.run(main())
    log.info("controller %s stopped", name)
    return 0


def add_controller_command(commands: Any) -> None:
    sub = commands.add_parser(
        "controller",
        help="run a controller: elect each broker group's master, fail over, fence",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    sub.add_argument(
        "--meta",
        required=True,
        metavar="URL",
        help="redis://H:P/N or redis+sentinel://H:P,.../SERVICE",
    )
    sub.add_argument("--name", default=None, help="name in logs (default: host-pid)")
    for key, text in _TIMING_FLAGS.items():
        flag = "--" + key.replace("_", "-")
        sub.add_argument(flag, type=int, default=None, metavar="N", help=text)
    sub.add_argument(
        "--unclean-election",
        action="store_true",
        help="elect outside the in-sync set when none of it is alive (can lose data)",
    )
    sub.set_defaults(func=_controller)
