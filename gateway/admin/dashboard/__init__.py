"""The web dashboard: an HTML page at ``/`` and its script and style sheet, shipped as
package data (no build step, nothing fetched from a network).

The page holds no data: it shows a login form, checks the credentials against
``/api/whoami`` and then reads and changes everything through the authenticated API from
the browser, as RabbitMQ's management UI does. So the files here are served without
authentication; they are the same for everyone.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter, HTTPException, Response

STATIC_PREFIX = "/dashboard/"
_MEDIA_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "ui.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
# Only our own files, no inline script or style, no framing: what the page shows comes from
# the API, and an API value must never run as code.
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@cache
def _asset(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _serve(name: str) -> Response:
    return Response(_asset(name), media_type=_MEDIA_TYPES[name], headers=_SECURITY_HEADERS)


def routes() -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/")
    async def page() -> Response:
        return _serve("index.html")

    @router.get(STATIC_PREFIX + "{name}")
    async def asset(name: str) -> Response:
        if name not in _MEDIA_TYPES or name == "index.html":
            raise HTTPException(404, f"no dashboard file '{name}'")
        return _serve(name)

    return router
