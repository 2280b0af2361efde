"""Path parameters that may contain '/': RabbitMQ's API writes the default vhost as ``%2F``
(``/api/queues/%2F/orders``), which the ASGI server decodes into an extra path segment.

``KeepEncodedSlashes`` re-decodes the raw path with every ``%2F`` turned into a private-use
character, so routing sees it as part of one segment; ``SlashRoute`` turns it back into '/'
in the path parameters the handler gets.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

ENCODED_SLASH = "\ue000"


class KeepEncodedSlashes:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw:
            text = raw.decode("latin-1").split("?", 1)[0]
            text = text.replace("%2F", ENCODED_SLASH).replace("%2f", ENCODED_SLASH)
            scope = {**scope, "path": unquote(text)}
        await self.app(scope, receive, send)


class SlashRoute(APIRoute):
    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        params: dict[str, Any] | None = child.get("path_params")
        if params:
            child["path_params"] = {
                k: v.replace(ENCODED_SLASH, "/") if isinstance(v, str) else v
                for k, v in params.items()
            }
        return match, child
