"""Per-vhost limits in the management API's shapes (RabbitMQ 3.10, meta.vhost_limits):
``GET /api/vhost-limits``, ``GET /api/vhost-limits/{vhost}``,
``PUT /api/vhost-limits/{vhost}/{name}`` with ``{"value": N}`` and
``DELETE /api/vhost-limits/{vhost}/{name}``; every one needs ``administrator``.

A PUT sets one limit and keeps the others, a DELETE removes one (RabbitMQ keeps the empty
set, shown as ``"value": []``). Bad names and values get RabbitMQ's 400 texts. In a cluster
the change reaches every gateway through the change feed (gateway/node/metadata_sync.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Body, Depends, HTTPException, Response

from gateway.admin.auth import ADMINISTRATOR, requires
from gateway.admin.paths import SlashRoute
from meta.models import User, VHostLimits
from meta.vhost_limits import LimitsInvalid, api_entry, check_limits

if TYPE_CHECKING:
    from gateway.node import Node


async def _existing_vhost(node: Node, vhost: str) -> None:
    if await node.meta.get_vhost(vhost) is None:
        raise HTTPException(404, "Not Found")


async def _change(node: Node, vhost: str, name: str, value: Any) -> None:
    """Set (``value`` given) or remove (None) limit ``name`` of ``vhost``, keeping the rest."""
    await _existing_vhost(node, vhost)
    current = await node.meta.get_vhost_limits(vhost)
    limits = dict(current.limits) if current is not None else {}
    if value is None:
        if current is None or name not in limits:
            return
        limits.pop(name)
    else:
        try:
            limits = check_limits({**limits, name: value})
        except LimitsInvalid as error:
            raise HTTPException(400, f"Validation failed\n\n{error}\n") from None
    updated = VHostLimits(vhost=vhost, limits=limits)
    await node.meta.set_vhost_limits(updated)
    node.vhost_limits[vhost] = updated  # the feed brings it too (cluster): idempotent


def routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    administrator = Depends(requires(ADMINISTRATOR, node))

    @router.get("/api/vhost-limits", summary="Every vhost's limits")
    async def list_limits(_user: User = administrator) -> list[dict[str, Any]]:
        return [api_entry(limits) for limits in await node.meta.list_vhost_limits()]

    @router.get("/api/vhost-limits/{vhost}", summary="A vhost's limits ([] if it has none)")
    async def get_limits(vhost: str, _user: User = administrator) -> list[dict[str, Any]]:
        await _existing_vhost(node, vhost)
        limits = await node.meta.get_vhost_limits(vhost)
        return [] if limits is None else [api_entry(limits)]

    @router.put(
        "/api/vhost-limits/{vhost}/{name}",
        status_code=204,
        summary='Set limit "max-connections" or "max-queues" (-1: none)',
    )
    async def put_limit(
        vhost: str,
        name: str,
        body: Annotated[dict[str, Any], Body()],
        _user: User = administrator,
    ) -> Response:
        if "value" not in body:
            raise HTTPException(400, "[{key_missing,value}]")
        await _change(node, vhost, name, body["value"])
        return Response(status_code=204)

    @router.delete("/api/vhost-limits/{vhost}/{name}", status_code=204, summary="Clear a limit")
    async def delete_limit(vhost: str, name: str, _user: User = administrator) -> Response:
        await _change(node, vhost, name, None)
        return Response(status_code=204)

    return router
