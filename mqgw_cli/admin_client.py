"""A small client of the gateway's admin API for the operator commands (standard library
only, so the CLI starts fast): basic authentication, JSON in and out."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from typing import Any

DEFAULT_ADMIN_URL = "http://127.0.0.1:15672"


class AdminUnreachable(Exception):
    """The admin API could not be reached at all (no HTTP answer)."""


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
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url.rstrip("/") + path, data=data, method=method)
    request.add_header("content-type", "application/json")
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    except urllib.error.URLError as error:
        raise AdminUnreachable(f"cannot reach the admin API at {url}: {error.reason}") from None
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, {"reason": raw.decode(errors="replace")}
