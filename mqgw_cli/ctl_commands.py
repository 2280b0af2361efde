"""`mqgw ctl stop|start|throttle|throttle-publish|clear SCOPE`, `mqgw ctl list [--json]`:
consumption and publish controls over the admin API (PUT/DELETE /api/controls/...). `list`
prints a table; ``--json`` the API's list. Where the admin API is and who calls it:
mqgw_cli/admin_target.py (``--admin``, ``--dir``, ``MQGW_ADMIN_*``, ``--config``, a credentials
file).

SCOPE is ``global``, ``node:NAME``, ``vhost:NAME``, ``client:NAME`` (a connection_name or a
source address), ``connection:NAME`` (``'127.0.0.1:51234 -> 127.0.0.1:5672'``) or
``queue:NAME`` (with ``--vhost``, default ``/``). ``throttle-publish SCOPE --rate N
[--bytes B]`` slows the publishers in SCOPE (not at the queue scope).

`mqgw ctl trace on|off [VHOST]` switches a vhost's firehose (RabbitMQ's ``rabbitmqctl
trace_on -p VHOST``) through PUT /api/vhosts/{name}, keeping its description and tags.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from typing import Any

from mqgw_cli.admin_client import Answer, ask, call
from mqgw_cli.admin_target import AdminTarget, add_admin_options
from mqgw_cli.gray_commands import add_gray_commands
from mqgw_cli.switchover_command import add_switchover_command
from mqgw_cli.vhost_limits_commands import add_vhost_limits_commands

SCOPE_FORMS = "global | node:N | vhost:N | client:N | connection:N | queue:N"
_SEGMENTS = {"node": "nodes", "client": "clients", "connection": "connections"}


def scope_path(scope: str, vhost: str) -> str:
    """The /api/controls/... path of a SCOPE argument; ValueError if it names no scope."""
    if scope == "global":
        return "/api/controls/global"
    kind, sep, name = scope.partition(":")
    if not sep or not name:
        raise ValueError(
            f"bad scope {scope!r}: use global, node:N, vhost:N, client:N, connection:N, queue:N"
        )
    quoted = urllib.parse.quote(name, safe="")
    if kind == "vhost":
        return f"/api/controls/vhosts/{quoted}"
    if kind == "queue":
        return f"/api/controls/queues/{urllib.parse.quote(vhost, safe='')}/{quoted}"
    if kind not in _SEGMENTS:
        raise ValueError(
            f"unknown scope kind {kind!r}: use node, vhost, client, connection or queue"
        )
    return f"/api/controls/{_SEGMENTS[kind]}/{quoted}"


def _rate(text: str) -> float | None:
    """A rate from the command line: a positive number, or 'none' to lift the limit."""
    if text.lower() in ("none", "null", "off"):
        return None
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("a rate must be a positive number (or 'none')")
    return value


def _body(args: argparse.Namespace) -> dict[str, Any]:
    if args.action == "stop":
        return {"state": "stopped"}
    if args.action == "start":
        return {"state": "running"}
    body: dict[str, Any] = {}
    if args.action == "throttle-publish":
        if args.rate is not _NOT_GIVEN:
            body["publish_rate_msgs"] = args.rate
        if args.bytes is not _NOT_GIVEN:
            body["publish_rate_bytes"] = args.bytes
        if not body:
            raise ValueError("throttle-publish needs --rate N and/or --bytes N ('none' lifts one)")
        return body
    if args.rate is not _NOT_GIVEN:
        body["rate_msgs"] = args.rate
    if args.rate_bytes is not _NOT_GIVEN:
        body["rate_bytes"] = args.rate_bytes
    if not body:
        raise ValueError("throttle needs --rate N and/or --rate-bytes N ('none' lifts one)")
    return body


def run_ctl(args: argparse.Namespace) -> int:
    def exchange(target: AdminTarget) -> Answer:
        if args.action == "list":
            return call(target, "GET", "/api/controls")
        path = scope_path(args.scope, args.vhost)
        if args.action == "clear":
            return call(target, "DELETE", path)
        return call(target, "PUT", path, _body(args))

    answer = ask(f"mqgw ctl {args.action}", args, exchange)
    if isinstance(answer, int):
        return answer
    if args.action == "list" and not args.json:
        _print_controls(answer.body or [])
    elif answer.body is not None:
        print(json.dumps(answer.body, indent=1))
    elif args.action != "list":
        print(f"{args.scope}: control cleared", file=sys.stderr)
    return 0


def scope_text(control: dict[str, Any]) -> str:
    """A control's scope as SCOPE is written on the command line: ``queue:orders``."""
    scope, name = str(control.get("scope", "?")), str(control.get("name", ""))
    return scope if scope == "global" else f"{scope}:{name}"


def _number(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


CONTROL_COLUMNS = (
    "SCOPE",
    "VHOST",
    "STATE",
    "MSGS/S",
    "BYTES/S",
    "PUB MSGS/S",
    "PUB BYTES/S",
    "SET BY",
    "SET AT",
)


def control_rows(controls: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    return [
        (
            scope_text(c),
            c.get("vhost") or "-",
            c.get("state") or "-",
            _number(c.get("rate_msgs")),
            _number(c.get("rate_bytes")),
            _number(c.get("publish_rate_msgs")),
            _number(c.get("publish_rate_bytes")),
            c.get("set_by") or "-",
            c.get("set_at") or "-",
        )
        for c in sorted(controls, key=lambda c: (str(c.get("scope")), str(c.get("name"))))
    ]


def _print_controls(controls: list[dict[str, Any]]) -> None:
    """A table, as `kubectl get` prints one (--json for scripts)."""
    if not controls:
        print("no consumption controls in force", file=sys.stderr)
        return
    rows = [CONTROL_COLUMNS, *control_rows(controls)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(CONTROL_COLUMNS))]
    for row in rows:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


def run_trace(args: argparse.Namespace) -> int:
    """Read the vhost, then PUT it back with ``tracing`` set (a PUT replaces the rest)."""
    path = "/api/vhosts/" + urllib.parse.quote(args.vhost, safe="")

    def exchange(target: AdminTarget) -> Answer:
        answer = call(target, "GET", path)
        if answer.status != 200:
            return answer
        vhost = answer.body
        body = {"description": vhost["description"], "tags": vhost["tags"]}
        return call(target, "PUT", path, {**body, "tracing": args.state == "on"})

    answer = ask(f"mqgw ctl trace {args.state}", args, exchange)
    if isinstance(answer, int):
        return answer
    print(f"tracing {args.state} for vhost '{args.vhost}'", file=sys.stderr)
    return 0


_NOT_GIVEN: Any = object()


def add_ctl_commands(commands: Any) -> None:
    ctl = commands.add_parser(
        "ctl", help="stop, start and throttle consumption; switch tracing (admin API)"
    )
    actions = ctl.add_subparsers(dest="action", required=True)
    helps = {
        "stop": "no new deliveries to the consumers in SCOPE (unacked ones stay theirs)",
        "start": "deliveries resume (overrides a stop of a wider scope)",
        "throttle": "limit deliveries in SCOPE to --rate msgs/s and/or --rate-bytes bytes/s",
        "throttle-publish": "slow the publishers in SCOPE to --rate msgs/s and/or --bytes"
        " bytes/s (back-pressure: nothing refused)",
        "clear": "remove SCOPE's control (wider scopes decide again)",
    }
    for action, text in helps.items():
        sub = actions.add_parser(action, help=text)
        sub.add_argument("scope", metavar="SCOPE", help=SCOPE_FORMS)
        sub.add_argument("--vhost", default="/", help="the queue's vhost (default /)")
        if action == "throttle":
            sub.add_argument("--rate", type=_rate, default=_NOT_GIVEN, help="msgs/s, or none")
            sub.add_argument(
                "--rate-bytes", type=_rate, default=_NOT_GIVEN, help="bytes/s, or none"
            )
        if action == "throttle-publish":
            sub.add_argument("--rate", type=_rate, default=_NOT_GIVEN, help="msgs/s, or none")
            sub.add_argument("--bytes", type=_rate, default=_NOT_GIVEN, help="bytes/s, or none")
        add_admin_options(sub)
        sub.set_defaults(func=run_ctl)
    listing = actions.add_parser("list", help="every control in force, as a table")
    listing.add_argument("--json", action="store_true", help="the API's JSON list, for scripts")
    add_admin_options(listing)
    listing.set_defaults(func=run_ctl)
    trace = actions.add_parser(
        "trace", help="switch a vhost's firehose (amq.rabbitmq.trace) on or off"
    )
    trace.add_argument("state", choices=("on", "off"))
    trace.add_argument("vhost", nargs="?", default="/", metavar="VHOST", help="default /")
    add_admin_options(trace)
    trace.set_defaults(func=run_trace)
    add_switchover_command(actions)
    add_vhost_limits_commands(actions)  # set-vhost-limits, clear-vhost-limits
    add_gray_commands(actions)  # gray on|off|list|delete
