"""A small client of the gateway's admin API for the operator commands (standard library
only, so the CLI starts fast): basic authentication, JSON in and out.

``call`` asks an ``AdminTarget`` (mqgw_cli/admin_target.py) and ``failure`` turns an error
answer into one line naming the URL; a 404 from a server that is not mqgw (a RabbitMQ on the
default port 15672, say) says so. ``ask`` is what a command runs: the target its arguments
name, an exchange with it, and one line and an exit code when something fails.
``admin_call`` is the plain form for tests and the bench.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mqgw_cli.admin_target import DEFAULT_ADMIN_URL, AdminConfigError, AdminTarget, admin_target

__all__ = [
    "DEFAULT_ADMIN_URL",
    "AdminUnreachable",
    "Answer",
    "admin_call",
    "ask",
    "call",
    "failure",
]

_PROBE_TIMEOUT_S = 5.0
_REASON_CHARS = 200  # of an answer's text in a message (an HTML error page, say)


class AdminUnreachable(Exception):
    """The admin API could not be reached at all (no HTTP answer)."""


@dataclass(frozen=True)
class Answer:
    method: str
    url: str  # the whole URL asked
    status: int
    body: Any  # decoded JSON, {"reason": text} when it was not JSON, None when empty
    phrase: str  # the HTTP reason phrase: "Not Found"


def _request(
    url: str,
    method: str,
    body: Any,
    user: str | None,
    password: str,
    timeout_s: float,
) -> Answer:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("content-type", "application/json")
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status, phrase, raw = response.status, response.reason, response.read()
    except urllib.error.HTTPError as error:
        status, phrase, raw = error.code, str(error.reason), error.read()
    except urllib.error.URLError as error:
        raise AdminUnreachable(f"cannot reach the admin API at {url}: {error.reason}") from None
    except (OSError, ValueError) as error:  # a reset or timeout mid-answer; a bad URL
        raise AdminUnreachable(f"cannot reach the admin API at {url}: {error}") from None
    try:
        decoded = json.loads(raw) if raw else None
    except ValueError:
        decoded = {"reason": raw.decode(errors="replace")}
    return Answer(method, url, status, decoded, phrase)


def admin_call(
    url: str,
    method: str,
    path: str,
    body: Any = None,
    user: str | None = "guest",
    password: str = "guest",
    timeout_s: float = 60,
) -> tuple[int, Any]:
    """One request; returns (HTTP status, decoded JSON or None). 4xx/5xx are returned.
    ``body`` is sent as JSON, or as it is when it is bytes; ``user`` None sends no login."""
    answer = _request(url.rstrip("/") + path, method, body, user, password, timeout_s)
    return answer.status, answer.body


def call(
    target: AdminTarget, method: str, path: str, body: Any = None, timeout_s: float = 60
) -> Answer:
    """One request to ``target``; AdminUnreachable (naming the URL and where it came from)
    when nothing answers."""
    url = target.url + path
    try:
        return _request(url, method, body, target.user, target.password, timeout_s)
    except AdminUnreachable as error:
        raise AdminUnreachable(f"{error} ({origin(target)})") from None


def origin(target: AdminTarget) -> str:
    """Where the URL came from, for messages."""
    if target.url_source == "the default":
        return "the default URL: give --admin URL or --dir D, or set MQGW_ADMIN_URL"
    return f"the URL is from {target.url_source}"


def reason(body: Any, phrase: str = "") -> str:
    """What an error answer says, on one line: the management API's ``reason``."""
    if isinstance(body, dict) and ("reason" in body or "error" in body):
        text = str(body.get("reason") or body.get("error"))
    elif body is None:
        text = phrase
    else:
        text = json.dumps(body)
    text = " ".join(text.split())
    return text if len(text) <= _REASON_CHARS else text[:_REASON_CHARS] + "…"


def identify(target: AdminTarget) -> str | None:
    """None when ``target`` answers as mqgw's admin API; otherwise what it seems to be."""
    try:
        health = call(target, "GET", "/api/health", timeout_s=_PROBE_TIMEOUT_S)
        body = health.body
        if health.status == 200 and isinstance(body, dict) and {"status", "node"} <= set(body):
            return None  # mqgw's open liveness answer
        overview = call(target, "GET", "/api/overview", timeout_s=_PROBE_TIMEOUT_S)
    except AdminUnreachable as error:
        return str(error)
    body = overview.body
    if overview.status == 200 and isinstance(body, dict) and body.get("product_name"):
        if body["product_name"] == "mqgw":
            return None
        name = f"{body['product_name']} {body.get('product_version') or ''}".strip()
        return f"its /api/overview says {name}"
    return f"it answers GET /api/health with {health.status} {health.phrase}".rstrip()


def failure(target: AdminTarget, answer: Answer) -> str:
    """One line for an error answer: the request, the URL, the status and the reason; for a
    401 the user and where it came from; for a 404 or 405 from a server that is not mqgw,
    that it is not, and where its URL came from."""
    said = reason(answer.body, answer.phrase)
    text = f"{answer.method} {answer.url} answered {answer.status} {said}"
    if answer.status == 401:
        return f"{text} (user '{target.user}' from {target.user_source})"
    if answer.status in (404, 405):
        other = identify(target)
        if other is not None:
            return f"{text}: {target.url} is not an mqgw admin API ({other}; {origin(target)})"
    return text


def ask(
    prog: str, args: argparse.Namespace, exchange: Callable[[AdminTarget], Answer]
) -> Answer | int:
    """``exchange`` with the admin API the arguments name, or the exit code once its one
    line is printed: 2 when the request or the configuration is wrong, 1 when the API did
    not answer or refused."""
    try:
        target = admin_target(args)
        answer = exchange(target)
    except (ValueError, AdminConfigError) as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    except AdminUnreachable as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 1
    if answer.status >= 400:
        print(f"{prog}: {failure(target, answer)}", file=sys.stderr)
        return 1
    return answer
