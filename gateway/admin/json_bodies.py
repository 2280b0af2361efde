"""Request bodies are JSON whatever their content type says, as RabbitMQ's management API
reads them (its handlers accept ``*/*``).

``curl -X PUT -d '{...}'`` sends ``application/x-www-form-urlencoded``; FastAPI passes such a
body to the handler as bytes, which fails validation with "Input should be a valid
dictionary". ``JsonBodies`` tells FastAPI the body is JSON instead, so it is parsed as such,
and a body that is not JSON gets the same 400 "not valid JSON" as one sent with
``content-type: application/json``.
"""

from __future__ import annotations

from email.message import Message

from starlette.types import ASGIApp, Receive, Scope, Send

JSON = b"application/json"
API_PREFIX = "/api/"


def is_json(content_type: bytes) -> bool:
    message = Message()
    message["content-type"] = content_type.decode("latin-1")
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


class JsonBodies:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and str(scope.get("path", "")).startswith(API_PREFIX):
            headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or [])
            kept = [(k, v) for k, v in headers if k.lower() != b"content-type"]
            declared = [v for k, v in headers if k.lower() == b"content-type"]
            if declared and not is_json(declared[-1]):
                scope = {**scope, "headers": [*kept, (b"content-type", JSON)]}
        await self.app(scope, receive, send)
