"""The admin HTTP API: one FastAPI app on the gateway's event loop, its routes grouped by
concern (queues and policies, users/vhosts/permissions, consumption controls, definitions).

Every route but ``/api/health`` needs HTTP basic authentication (gateway/admin/auth.py).
Errors are JSON in the management plugin's shape, ``{"error": ..., "reason": ...}``; a body
that is not JSON or does not fit is a 400, as RabbitMQ answers, not FastAPI's 422 (a body is
JSON whatever its content type says: gateway/admin/json_bodies.py); a call that needs a
broker group that is down (cluster) is a 503.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.admin import (
    access_api,
    cluster_views,
    connections_api,
    controls_api,
    dashboard,
    definitions_api,
    elastic_api,
    gray_api,
    groups_api,
    messages_api,
    metrics_api,
    offsets_api,
    overview_api,
    queues_api,
    rescale_api,
    topology_api,
    vhost_limits_api,
)
from gateway.admin.json_bodies import JsonBodies
from gateway.admin.paths import KeepEncodedSlashes
from meta.errors import MetadataUnavailable
from storage import BrokerUnavailable

if TYPE_CHECKING:
    from gateway.node import Node

_ERROR_NAMES = {
    400: "bad_request",
    401: "not_authorized",
    403: "access_refused",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    503: "service_unavailable",
}


def error_body(status: int, reason: str) -> dict[str, Any]:
    return {"error": _ERROR_NAMES.get(status, "error"), "reason": reason}


def _describe(errors: list[Any]) -> str:
    parts = []
    for error in errors:
        if error.get("type") == "json_invalid":  # say what and where, not "decode error"
            what = (error.get("ctx") or {}).get("error") or error.get("msg", "")
            at = error.get("loc", ())[-1:] or ("?",)
            return f"the request body is not valid JSON: {what} at character {at[0]}"
        where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        parts.append(f"{where}: {error.get('msg', 'invalid')}" if where else error.get("msg", ""))
    return "; ".join(parts) or "invalid request"


def view_snapshot(node: Node) -> dict[str, Any]:
    """This gateway's objects and figures, as the other gateways of a cluster show them."""
    return {
        **connections_api.local_objects(node),
        "node": overview_api.node_json(node),
        "message_stats": node.stats.message_stats(),
    }


def create_app(node: Node) -> FastAPI:
    app = FastAPI(
        title="mqgw admin",
        version="0.1.0",
        description="Management API of an mqgw gateway (RabbitMQ's shapes where they exist). "
        "HTTP basic authentication against the gateway's users; /api/health is open.",
    )

    app.add_middleware(KeepEncodedSlashes)
    app.add_middleware(JsonBodies)  # curl -d '{...}' (form-encoded): JSON, as RabbitMQ reads it

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            error_body(exc.status_code, str(exc.detail)),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(400, _describe(list(exc.errors()))), status_code=400)

    @app.exception_handler(BrokerUnavailable)
    async def broker_away(_request: Request, exc: BrokerUnavailable) -> JSONResponse:
        # A queue whose broker group is down (cluster): the figures it needs cannot be read.
        return JSONResponse(error_body(503, str(exc)), status_code=503)

    @app.exception_handler(MetadataUnavailable)
    async def meta_away(_request: Request, exc: MetadataUnavailable) -> JSONResponse:
        # Redis away (cluster): what needs it cannot be read or changed now; the rest works.
        return JSONResponse(error_body(503, str(exc)), status_code=503)

    @app.get("/api/health", summary="Liveness: the node is up and serving AMQP (no login)")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "node": node.name,
            "connections": node.open_connections,
            "vhosts": sorted(node.vhosts),
            "queues": sum(len(v.queues) for v in node.vhosts.values()),
            "alarms": [a.name for a in node.alarms.alarms if a.blocked],
            "memory": node.memory_breakdown(),
        }

    for module in (queues_api, access_api, connections_api, controls_api, definitions_api):
        app.include_router(module.routes(node))
    for module in (overview_api, topology_api, messages_api, metrics_api):  # management, /metrics
        app.include_router(module.routes(node))
    app.include_router(offsets_api.routes(node))  # POST /api/queues/{vhost}/{name}/reset
    app.include_router(vhost_limits_api.routes(node))  # /api/vhost-limits
    app.include_router(gray_api.routes(node))  # /api/gray/rules
    app.include_router(rescale_api.routes(node))  # /api/queues/{vhost}/{name}/rescale
    app.include_router(elastic_api.routes(node))  # .../scale, .../move, .../route
    app.include_router(groups_api.routes(node))  # /api/cluster/shares, rebalance, groups, moves
    app.include_router(dashboard.routes())  # `/` and /dashboard/*: the web page (no data)
    # Cluster: what the other gateways' views show of this one (gateway/cluster/views.py).
    cluster_views.attach(node, lambda: view_snapshot(node))
    return app
