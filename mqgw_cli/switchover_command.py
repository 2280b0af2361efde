"""`mqgw ctl switchover GROUP (--dir D | --meta URL) [--to BROKER]`: a planned change of a
replicated group's master (the leading controller fences the master, waits until the target
holds its whole log, then elects the target; docs/replication.md). Waits for the new master
and prints how long the switch took; exit 1 if it did not happen within --timeout (the
controller lifts the fence after its switchover timeout: the old master confirms again).

Brokers are named as `mqgw cluster status` names them, ``broker-g1-1``; ``--to`` also takes
the bare id (``1``). The Redis URL: ``--meta`` > ``--dir D`` (D/cluster.json) > ``meta`` as
`mqgw serve` reads it (``MQGW_META``, the ``--config`` file).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

from localcluster.broker_names import broker_id, broker_name, broker_names

PROG = "mqgw ctl switchover"


class Refused(Exception):
    """Bad usage or a state that makes the switchover impossible: one line, exit 2."""


def shown_url(url: str) -> str:
    """``url`` without its password, for messages."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def meta_url(args: argparse.Namespace) -> str:
    """The Redis URL to ask: --meta, else D/cluster.json's, else the settings' ``meta``."""
    if args.meta:
        return str(args.meta)
    if args.dir is not None:
        from localcluster.layout import ClusterError, load

        try:
            cluster = load(args.dir.resolve())
        except ClusterError as error:
            raise Refused(str(error)) from None
        replicated = cluster.replicated_groups()
        if args.group not in replicated:
            which = ", ".join(replicated) or "none"
            raise Refused(
                f"{args.group} is not a replicated group of the cluster in {args.dir} "
                f"(replicated groups: {which}): only a group with replicas can switch masters"
            )
        return cluster.meta_url
    from gateway.config.sources import ConfigError, env_name, resolve

    names = (env_name("meta"), env_name("config_file"))
    flags = {"config_file": args.config} if args.config is not None else {}
    try:
        settings = resolve(flags, {k: v for k, v in os.environ.items() if k in names}).settings
    except ConfigError as error:
        raise Refused(f"configuration error: {error}") from None
    if settings.meta is None:
        raise Refused(
            "which cluster? give --dir D (a local cluster's directory) or --meta redis://H:P/N "
            f"(or set {env_name('meta')}, or meta in the --config file)"
        )
    return settings.meta


def run_switchover(args: argparse.Namespace) -> int:
    import anyio

    try:
        url = meta_url(args)
        target = broker_id(args.group, args.to) if args.to else ""
    except (Refused, ValueError) as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 2
    code: int = anyio.run(_switchover, args, url, target)
    return code


async def _switchover(args: argparse.Namespace, url: str, target: str) -> int:
    from redis.asyncio import Redis
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import RedisError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from meta.redis_url import async_client

    try:
        client: Redis = async_client(url, connect_timeout_s=2.0, socket_timeout_s=5.0)
    except ValueError as error:  # not a redis:// URL
        print(f"{PROG}: bad Redis URL {shown_url(url)}: {error}", file=sys.stderr)
        return 2
    try:
        return await _switch(client, args.group, target, args.timeout)
    except (RedisConnectionError, RedisTimeoutError, OSError) as error:
        # One line: the operator needs to know which Redis and why, not redis-py's stack.
        print(f"{PROG}: cannot reach Redis at {shown_url(url)}: {error}", file=sys.stderr)
        return 1
    except RedisError as error:
        print(f"{PROG}: Redis at {shown_url(url)} answered: {error}", file=sys.stderr)
        return 1
    finally:
        await client.aclose()


async def _switch(client: Any, group: str, target: str, timeout_s: float) -> int:
    import anyio

    from meta.groups.link import GroupLink

    link = GroupLink(client)
    before = await link.record(group)
    if not before.master:
        print(f"{PROG}: group {group} has no master (is it a replicated group?)", file=sys.stderr)
        return 2
    master = broker_name(group, before.master)
    if target == before.master:
        print(f"{PROG}: {master} is the master of {group} already", file=sys.stderr)
        return 2
    if target and target not in before.in_sync:
        print(
            f"{PROG}: {broker_name(group, target)} is not an in-sync replica of {group} "
            f"(master {master}; in sync: {broker_names(group, before.in_sync)})",
            file=sys.stderr,
        )
        return 2
    started = time.monotonic()
    await link.request_switchover(group, target)
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        record = await link.record(group)
        if record.epoch > before.epoch and record.master != before.master:
            took = time.monotonic() - started
            print(
                f"group {group}: master {master} -> {broker_name(group, record.master)} "
                f"at epoch {record.epoch} in {took:.2f} s"
            )
            return 0
        await anyio.sleep(0.02)
    print(
        f"{PROG}: group {group} still has master {master} after {timeout_s:g} s "
        "(is a controller running? is a replica in sync?)",
        file=sys.stderr,
    )
    return 1


def add_switchover_command(actions: Any) -> None:
    switchover = actions.add_parser(
        "switchover",
        help="move a replicated group's master to an in-sync replica (planned)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    switchover.add_argument("group", metavar="GROUP", help="g1, as `mqgw cluster status` says")
    where = switchover.add_mutually_exclusive_group()
    where.add_argument(
        "--dir", type=Path, default=None, metavar="D", help="a local cluster (D/cluster.json)"
    )
    where.add_argument(
        "--meta",
        default=None,
        metavar="URL",
        help="its Redis: redis://H:P/N or redis+sentinel://H:P,.../SERVICE",
    )
    switchover.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="a gateway's TOML settings file: its meta (env MQGW_CONFIG_FILE)",
    )
    switchover.add_argument(
        "--to",
        default="",
        metavar="BROKER",
        help="target: broker-g1-1 as status names it, or its id (default: the best replica)",
    )
    switchover.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    switchover.set_defaults(func=run_switchover)
