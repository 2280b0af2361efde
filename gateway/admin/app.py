"""The admin HTTP API. For now: health. Management-API shapes come with later issues."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

if TYPE_CHECKING:
    from gateway.node import Node


def create_app(node: Node) -> FastAPI:
    app = FastAPI(title="mqgw admin", version="0.1.0")

    @app.get("/api/health", summary="Liveness: the node is up and serving AMQP")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "connections": node.open_connections,
            "vhosts": sorted(node.vhosts),
            "queues": sum(len(v.queues) for v in node.vhosts.values()),
        }

    return app
