"""`mqgw ctl gray on|off|list|delete`: the operator's gray release rules over the admin API
(/api/gray/rules, gateway/admin/gray_api.py); `mqgw ctl gray end|resume`: a queue's gray
release ended or resumed (/api/gray/queues/{vhost}/{name}[/end]).

``on RULE [--connection-name GLOB] [--user U] [--address ADDR_OR_CIDR] [--switch on|off]``
makes the matching connections gray. The match options given replace the rule's match whole;
with none, the stored rule's match is kept (a new rule needs one). ``--switch`` not given
keeps the stored rule's switch. ``off RULE [--drain] [--no-wait] [--timeout S]`` sets the
rule's gray to false, keeping its match and switch; with ``--drain`` the switch back waits
for the gray partitions to drain, and the command waits with it: every 0.5 s it prints what
is still pending (the rule's ``status["pending"]``), then how long it took; exit 1 after
``--timeout`` seconds (default 300). ``list [--json]`` prints the rules; ``delete RULE``
removes one.

``end QUEUE [--vhost V] [--no-wait] [--timeout S]`` ends the queue's gray release (it has no
gray partitions from then on), then, unless ``--no-wait``, polls every 0.5 s printing how
many messages its former gray partitions still hold from before the end (``left N`` and per
partition) until none, then how long the drain took; exit 1 after ``--timeout`` seconds
(default 300; the end stays). ``resume QUEUE [--vhost V]`` gives the queue its gray
partitions back. Where the admin API is and who calls it: mqgw_cli/admin_target.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse
from typing import Any

from mqgw_cli.admin_client import Answer, ask, call
from mqgw_cli.admin_target import AdminTarget, add_admin_options

POLL_INTERVAL_S = 0.5
DEFAULT_TIMEOUT_S = 300.0
# The match's keys and the options that give them (``--user`` is the match's: see below).
_MATCH_OPTIONS = {"connection_name": "connection_name", "user": "match_user", "address": "address"}
COLUMNS = ("NAME", "GRAY", "CONNECTION NAME", "USER", "ADDRESS", "SWITCH", "DRAIN", "SET AT")


def _path(rule: str = "") -> str:
    return "/api/gray/rules" + ("/" + urllib.parse.quote(rule, safe="") if rule else "")


def _queue_path(vhost: str, queue: str, end: bool = False) -> str:
    quoted = f"{urllib.parse.quote(vhost, safe='')}/{urllib.parse.quote(queue, safe='')}"
    return f"/api/gray/queues/{quoted}" + ("/end" if end else "")


def _stored(target: AdminTarget, rule: str) -> tuple[Answer, dict[str, Any] | None]:
    """The rule as stored (None with a 404 answer: there is none)."""
    answer = call(target, "GET", _path(rule))
    return answer, answer.body if answer.status == 200 else None


def _put_on(target: AdminTarget, args: argparse.Namespace) -> Answer:
    answer, stored = _stored(target, args.rule)
    if stored is None and answer.status != 404:
        return answer
    given = {k: getattr(args, a) for k, a in _MATCH_OPTIONS.items() if getattr(args, a) is not None}
    if not given and stored is None:
        raise ValueError(
            f"no gray rule '{args.rule}' yet: say which connections it matches with"
            " --connection-name, --user and/or --address"
        )
    match = given or (stored or {})["match"]
    switch = (stored or {}).get("switch") if args.switch is None else args.switch == "on"
    body = {"match": match, "gray": True, "switch": switch}
    return call(target, "PUT", _path(args.rule), body)


def _put_off(target: AdminTarget, args: argparse.Namespace) -> Answer:
    answer, stored = _stored(target, args.rule)
    if stored is None:
        return answer
    body = {"match": stored["match"], "gray": False, "switch": stored.get("switch")}
    return call(target, "PUT", _path(args.rule), {**body, "drain": args.drain})


def run_gray(args: argparse.Namespace) -> int:
    prog = f"mqgw ctl gray {args.gray_action}"

    def exchange(target: AdminTarget) -> Answer:
        if args.gray_action == "on":
            return _put_on(target, args)
        if args.gray_action == "off":
            return _put_off(target, args)
        if args.gray_action == "delete":
            return call(target, "DELETE", _path(args.rule))
        return call(target, "GET", _path())

    answer = ask(prog, args, exchange)
    if isinstance(answer, int):
        return answer
    if args.gray_action == "list":
        _print_rules(answer.body or [], args.json)
    elif args.gray_action == "on":
        done = "created" if answer.status == 201 else "replaced"
        print(f"gray rule '{args.rule}': gray on ({done})", file=sys.stderr)
    elif args.gray_action == "delete":
        print(f"gray rule '{args.rule}': deleted", file=sys.stderr)
    elif args.drain and not args.no_wait:
        return _wait_drained(prog, args)
    else:
        print(f"gray rule '{args.rule}': gray off", file=sys.stderr)
    return 0


def _wait_drained(prog: str, args: argparse.Namespace) -> int:
    """Poll the rule's status until nothing is pending, or the timeout."""
    started = time.monotonic()
    while True:
        answer = ask(prog, args, lambda target: call(target, "GET", _path(args.rule)))
        if isinstance(answer, int):
            return answer
        pending = ((answer.body or {}).get("status") or {}).get("pending") or []
        took = time.monotonic() - started
        if not pending:
            print(f"gray rule '{args.rule}': gray off, drained in {took:.1f} s")
            return 0
        if took >= args.timeout:
            print(
                f"{prog}: gray rule '{args.rule}' still waits for {len(pending)} after"
                f" {args.timeout:g} s (gray is off; the switch back goes on without us)",
                file=sys.stderr,
            )
            return 1
        print(f"waiting ({took:.1f} s) for {len(pending)}: {_compact(pending)}", flush=True)
        time.sleep(POLL_INTERVAL_S)


def run_gray_end(args: argparse.Namespace) -> int:
    """``end`` and ``resume``."""
    prog = f"mqgw ctl gray {args.gray_action}"
    where = f"queue '{args.queue}'" + ("" if args.vhost == "/" else f" in vhost '{args.vhost}'")
    method = "POST" if args.gray_action == "end" else "DELETE"
    path = _queue_path(args.vhost, args.queue, end=True)
    answer = ask(prog, args, lambda target: call(target, method, path))
    if isinstance(answer, int):
        return answer
    if args.gray_action == "resume":
        print(f"gray release of {where}: resumed", file=sys.stderr)
        return 0
    ends = sorted(int(p) for p in ((answer.body or {}).get("ends") or {}))
    done = "ended" if answer.status == 202 else "had ended already"
    partitions = ", ".join(str(p) for p in ends) or "none"
    print(f"gray release of {where}: {done} (gray partitions {partitions})", file=sys.stderr)
    return 0 if args.no_wait else _wait_ended(prog, args, where)


def _wait_ended(prog: str, args: argparse.Namespace, where: str) -> int:
    """Poll the queue's gray status until its former gray partitions are drained."""
    started = time.monotonic()
    path = _queue_path(args.vhost, args.queue)
    while True:
        answer = ask(prog, args, lambda target: call(target, "GET", path))
        if isinstance(answer, int):
            return answer
        status = (answer.body or {}).get("status")
        took = time.monotonic() - started
        if status is None:
            print(f"{prog}: gray release of {where} was resumed meanwhile", file=sys.stderr)
            return 1
        left = int(status["left"])
        if left == 0:
            print(f"gray release of {where} ended; its gray partitions drained in {took:.1f} s")
            return 0
        if took >= args.timeout:
            print(
                f"{prog}: {where} still has {left} message(s) from before the end in its"
                f" former gray partitions after {args.timeout:g} s (gray release stays"
                " ended: every consumer reads them)",
                file=sys.stderr,
            )
            return 1
        counts = ", ".join(
            f"partition {p['partition']}: {p['messages']}" for p in status["partitions"]
        )
        print(f"waiting ({took:.1f} s): left {left} ({counts})", flush=True)
        time.sleep(POLL_INTERVAL_S)


def _compact(pending: list[Any]) -> str:
    return "; ".join(json.dumps(item, separators=(",", ":")) for item in pending)


def _print_rules(rules: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rules, indent=1))
        return
    if not rules:
        print("no gray rules", file=sys.stderr)
        return
    rows = [COLUMNS, *(_row(rule) for rule in rules)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _row(rule: dict[str, Any]) -> tuple[str, ...]:
    match = rule.get("match") or {}
    switch = rule.get("switch")
    return (
        str(rule.get("name")),
        "on" if rule.get("gray") else "off",
        match.get("connection_name") or "-",
        match.get("user") or "-",
        match.get("address") or "-",
        "-" if switch is None else "on" if switch else "off",
        "yes" if rule.get("drain") else "no",
        rule.get("set_at") or "-",
    )


def add_gray_commands(actions: Any) -> None:
    gray = actions.add_parser("gray", help="gray release rules: which connections are gray")
    subs = gray.add_subparsers(dest="gray_action", required=True)
    on = subs.add_parser("on", help="make the connections RULE matches gray (create or replace)")
    add_admin_options(on)
    on.add_argument("--connection-name", metavar="GLOB", help="the client's connection_name")
    # --match-user: --user is the admin user, as in every other ctl command.
    on.add_argument("--match-user", metavar="U", help="the connection's user")
    on.add_argument("--address", metavar="ADDR_OR_CIDR", help="the client's IP or a CIDR")
    on.add_argument("--switch", choices=("on", "off"), help="off: no gray handling for them")
    off = subs.add_parser("off", help="switch RULE's connections back (gray false)")
    off.add_argument("--drain", action="store_true", help="only once the gray partitions drain")
    off.add_argument("--no-wait", action="store_true", help="with --drain: do not wait")
    off.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S", help="default 300"
    )
    delete = subs.add_parser("delete", help="remove RULE")
    for sub in (on, off, delete):
        sub.add_argument("rule", metavar="RULE")
    listing = subs.add_parser("list", help="every gray rule, as a table")
    listing.add_argument("--json", action="store_true", help="the API's JSON list, for scripts")
    for sub in (off, delete, listing):
        add_admin_options(sub)
    for sub in (on, off, delete, listing):
        sub.set_defaults(func=run_gray)
    end = subs.add_parser(
        "end", help="end QUEUE's gray release (no gray partitions) and wait for them to drain"
    )
    end.add_argument("--no-wait", action="store_true", help="do not wait for the drain")
    end.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S", help="default 300"
    )
    resume = subs.add_parser("resume", help="give QUEUE its gray partitions back")
    for sub in (end, resume):
        sub.add_argument("queue", metavar="QUEUE")
        sub.add_argument("--vhost", default="/", help="the queue's vhost (default /)")
        add_admin_options(sub)
        sub.set_defaults(func=run_gray_end)
