"""`mqgw ctl set-vhost-limits VHOST JSON` and `mqgw ctl clear-vhost-limits VHOST [NAME]`:
a vhost's limits over the admin API (/api/vhost-limits), as rabbitmqctl set_vhost_limits and
clear_vhost_limits change them.

``set-vhost-limits`` replaces the whole set: the limits in JSON are set (PUT each one) and the
vhost's others are cleared, e.g. ``mqgw ctl set-vhost-limits / '{"max-connections": 10}'``
(-1: no limit; 0 for max-connections: no connections at all). ``clear-vhost-limits`` removes
NAME, or every limit of the vhost without one.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from typing import Any

from mqgw_cli.admin_client import Answer, ask, call
from mqgw_cli.admin_target import AdminTarget, add_admin_options


def _path(vhost: str, name: str = "") -> str:
    path = "/api/vhost-limits/" + urllib.parse.quote(vhost, safe="")
    return path + ("/" + urllib.parse.quote(name, safe="") if name else "")


def _current(target: AdminTarget, vhost: str) -> tuple[Answer, list[str]]:
    answer = call(target, "GET", _path(vhost))
    if answer.status != 200:
        return answer, []
    return answer, [name for entry in answer.body or [] for name in entry["value"] or {}]


def _change(target: AdminTarget, args: argparse.Namespace) -> Answer:
    """The requests of the command, stopping at the first refused one."""
    answer, names = _current(target, args.vhost)
    if answer.status != 200:
        return answer
    wanted: dict[str, Any] = args.limits if args.action == "set-vhost-limits" else {}
    dropped = [n for n in names if n not in wanted and (not args.name or n == args.name)]
    if args.action == "clear-vhost-limits" and args.name and args.name not in names:
        dropped = [args.name]  # not there: the API answers it, as for any name
    for name in dropped:
        answer = call(target, "DELETE", _path(args.vhost, name))
        if answer.status >= 400:
            return answer
    for name, value in wanted.items():
        answer = call(target, "PUT", _path(args.vhost, name), {"value": value})
        if answer.status >= 400:
            return answer
    return answer


def run_vhost_limits(args: argparse.Namespace) -> int:
    def exchange(target: AdminTarget) -> Answer:
        if args.action == "set-vhost-limits":
            args.limits = json.loads(args.json)
            if not isinstance(args.limits, dict):
                raise ValueError("JSON must be an object, e.g. '{\"max-queues\": 5}'")
        return _change(target, args)

    answer = ask(f"mqgw ctl {args.action}", args, exchange)
    if isinstance(answer, int):
        return answer
    done = "set" if args.action == "set-vhost-limits" else "cleared"
    print(f"vhost '{args.vhost}': limits {done}", file=sys.stderr)
    return 0


def add_vhost_limits_commands(actions: Any) -> None:
    setter = actions.add_parser(
        "set-vhost-limits", help="replace a vhost's limits (max-connections, max-queues)"
    )
    setter.add_argument("vhost", metavar="VHOST")
    setter.add_argument("json", metavar="JSON", help="e.g. '{\"max-connections\": 10}'")
    clearer = actions.add_parser("clear-vhost-limits", help="remove a vhost's limit(s)")
    clearer.add_argument("vhost", metavar="VHOST")
    clearer.add_argument("name", nargs="?", default="", metavar="NAME", help="default: all")
    setter.set_defaults(name="")
    for sub in (setter, clearer):
        add_admin_options(sub)
        sub.set_defaults(func=run_vhost_limits)
