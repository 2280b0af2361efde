"""`mqgw definitions export|import FILE`: RabbitMQ-format definitions over the admin API
(GET/POST /api/definitions[/VHOST]). FILE "-" is stdout / stdin.

An import is checked whole by the gateway first: a refused file changes nothing and the
command exits 1 with the gateway's reason. While a large file is applied the gateway streams
progress, printed here about once a second; the summary line ends the output.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mqgw_cli.admin_client import AdminUnreachable, Answer, call, failure, origin
from mqgw_cli.admin_target import AdminConfigError, AdminTarget, add_admin_options, admin_target

LARGE_FILE_ENTITIES = 1000  # from this many entities on, progress lines are printed
IMPORT_TIMEOUT_S = 600.0  # per read: checking a very large file takes a while
ENTITY_KINDS = (
    "users", "vhosts", "permissions", "topic_permissions", "parameters",
    "global_parameters", "policies", "queues", "exchanges", "bindings",
)  # fmt: skip


def _path(vhost: str | None) -> str:
    if vhost is None:
        return "/api/definitions"
    return "/api/definitions/" + urllib.parse.quote(vhost, safe="")


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _count(document: Any) -> dict[str, int]:
    if not isinstance(document, dict):
        return {}
    return {k: len(v) for k in ENTITY_KINDS if isinstance(v := document.get(k), list) and v}


def _counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in counts.items()) or "nothing"


def export(args: argparse.Namespace) -> int:
    try:
        target = admin_target(args)
        answer = call(target, "GET", _path(args.vhost))
    except AdminConfigError as error:
        _err(f"mqgw definitions export: {error}")
        return 2
    except AdminUnreachable as error:
        _err(str(error))
        return 1
    if answer.status != 200:
        _err(f"export failed: {failure(target, answer)}")
        return 1
    document = answer.body
    text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    if args.file == "-":
        sys.stdout.write(text)
    else:
        Path(args.file).write_text(text, encoding="utf-8")
    where = "stdout" if args.file == "-" else args.file
    _err(f"exported {_counts_text(_count(document))} to {where}")
    return 0


def _reason(answer: Any) -> str:
    if isinstance(answer, dict) and "reason" in answer:
        return str(answer["reason"])
    return json.dumps(answer)


def stream_import(
    target: AdminTarget,
    path: str,
    body: bytes,
    timeout_s: float = IMPORT_TIMEOUT_S,
) -> tuple[Answer, Iterator[dict[str, Any]]]:
    """POST ``body`` with ?progress=1: (the answer, its JSON lines). A 4xx answer is one
    line, the management API's error object (also the answer's ``body``)."""
    url = target.url + path
    request = urllib.request.Request(url + "?progress=1", data=body, method="POST")
    request.add_header("content-type", "application/json")
    token = base64.b64encode(f"{target.user}:{target.password}".encode()).decode()
    request.add_header("authorization", f"Basic {token}")
    try:
        response = urllib.request.urlopen(request, timeout=timeout_s)
    except urllib.error.HTTPError as error:
        raw = error.read()
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            parsed = {"reason": raw.decode(errors="replace")}
        answer = Answer("POST", url, error.code, parsed, str(error.reason))
        return answer, iter([parsed])
    except urllib.error.URLError as error:
        raise AdminUnreachable(
            f"cannot reach the admin API at {url}: {error.reason} ({origin(target)})"
        ) from None

    def lines() -> Iterator[dict[str, Any]]:
        with response:
            for line in response:
                if line.strip():
                    yield json.loads(line)

    return Answer("POST", url, response.status, None, response.reason), lines()


def import_(args: argparse.Namespace) -> int:
    from meta.definitions import summary_text

    source = "stdin" if args.file == "-" else args.file
    try:
        body = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    except OSError as error:
        _err(f"cannot read {source}: {error}")
        return 1
    try:
        counts = _count(json.loads(body)) if body.strip() else {}
    except ValueError:
        counts = {}  # the gateway says what is wrong with it
    large = sum(counts.values()) >= LARGE_FILE_ENTITIES
    if large:
        _err(f"importing {source}: {_counts_text(counts)} ({len(body) / 1e6:.1f} MB)")
    try:
        target = admin_target(args)
        first, answers = stream_import(target, _path(args.vhost), body)
        if first.status != 200:
            _err(f"import refused: {failure(target, first)}")
            return 1
        for answer in answers:
            if "progress" in answer:
                done = answer["progress"]
                if large and done["done"] == 0:
                    _err(f"checked: {done['total']} changes to apply")
                elif large:
                    _err(
                        f"progress: {done['done']}/{done['total']} changes applied "
                        f"({done['kind']}), {done['seconds']:.1f} s"
                    )
            elif "summary" in answer:
                summary = answer["summary"]
                for warning in summary.get("warnings", []):
                    _err(f"warning: {warning}")
                print(
                    f"imported {source} in {summary.get('seconds', 0):.1f} s: "
                    f"{summary_text(summary)}"
                )
                return 0
            else:
                _err(f"import failed: {_reason(answer)}")
                return 1
    except AdminConfigError as error:
        _err(f"mqgw definitions import: {error}")
        return 2
    except AdminUnreachable as error:
        _err(str(error))
        return 1
    except (OSError, ValueError) as error:
        _err(f"import: the connection to the admin API broke: {error}")
        return 1
    _err("import: the admin API ended without a summary")
    return 1


def add_definitions_commands(commands: Any) -> None:
    definitions = commands.add_parser(
        "definitions", help="export/import definitions (RabbitMQ's JSON format)"
    )
    cmds = definitions.add_subparsers(dest="command", required=True)
    for name, func, text in (
        ("export", export, "write the gateway's definitions to FILE ('-': stdout)"),
        ("import", import_, "import FILE ('-': stdin): all of it, or nothing if it is refused"),
    ):
        sub = cmds.add_parser(name, help=text)
        sub.add_argument("file", metavar="FILE")
        sub.add_argument("--vhost", default=None, help="one vhost only (RabbitMQ's per-vhost form)")
        add_admin_options(sub)
        sub.set_defaults(func=func)
