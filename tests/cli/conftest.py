"""``not_mqgw``: an HTTP server on loopback that answers as RabbitMQ's management plugin."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class NotMqgw:
    """An HTTP server on loopback that is not mqgw: RabbitMQ's management plugin's answers
    (its /api/overview, and its 404 for a path it lacks, such as /api/controls)."""

    url: str
    port: int
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # method, path, auth


@pytest.fixture
def not_mqgw() -> Iterator[NotMqgw]:
    seen: list[tuple[str, str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.answer()

        def do_PUT(self) -> None:
            self.answer()

        def answer(self) -> None:
            seen.append((self.command, self.path, self.headers.get("authorization", "")))
            if self.path == "/api/overview":
                status, body = 200, {"product_name": "RabbitMQ", "product_version": "3.12.1"}
            else:
                status, body = 404, {"error": "Object Not Found", "reason": "Not Found"}
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        yield NotMqgw(f"http://127.0.0.1:{port}", int(port), seen)
    finally:
        server.shutdown()
        server.server_close()
