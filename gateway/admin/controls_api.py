"""Consumption controls over HTTP: stop, start and throttle deliveries by scope.

``PUT /api/controls/{scope path}`` with ``{"state": "stopped"|"running", "rate_msgs": N|null,
"rate_bytes": N|null, "publish_rate_msgs": N|null, "publish_rate_bytes": N|null}`` merges
into the scope's control (a field left out keeps its value, null clears it); ``DELETE``
removes the control; ``GET /api/controls`` lists them all. Scope paths: ``global``,
``nodes/{node}``, ``vhosts/{vhost}``, ``clients/{connection_name or address}``,
``connections/{connection name}``, ``queues/{vhost}/{queue}``. Publish rates do not apply
at the queue scope (a publish is throttled before it is routed). Reading needs ``monitoring``,
changing ``administrator``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, HTTPException, Response
from pydantic import BaseModel, ConfigDict, Field

from gateway.admin import cluster_views
from gateway.admin.auth import ADMINISTRATOR, MONITORING, requires
from gateway.admin.paths import SlashRoute
from gateway.controls import Controls, Key, key_of
from meta.models import ConsumptionControl, ControlScope, User

if TYPE_CHECKING:
    from gateway.node import Node

# strict: "100", true and NaN are refused rather than read as numbers.
Rate = Annotated[float, Field(gt=0, strict=True, allow_inf_nan=False)]


class ControlBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state: Literal["stopped", "running"] | None = None
    rate_msgs: Rate | None = None
    rate_bytes: Rate | None = None
    publish_rate_msgs: Rate | None = None
    publish_rate_bytes: Rate | None = None


def control_json(control: ConsumptionControl, controls: Controls) -> dict[str, Any]:
    """The control as stored; in a cluster, a rate that totals over the gateways also shows
    this gateway's share of it now (``this_gateway``)."""
    found = control.model_dump()
    here = controls.this_gateway(control.key)
    if here is not None:
        found["this_gateway"] = here
    return found


class _ScopeControls:
    """What every scope's endpoints do with the node's controls: check that the scope names
    something, then read, merge into or clear its control."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.controls = node.controls

    async def checked(self, key: Key, user: User) -> Key:
        """404 for a scope that names nothing the cluster knows (clients may come later);
        a node or a connection may be another live gateway's (its gateway applies it)."""
        node = self.node
        scope, vhost, name = key
        if scope == "node" and name != node.name:
            others = [v.get("node", {}).get("name") for v in await cluster_views.elsewhere(node)]
            if name not in others:
                raise HTTPException(404, f"no node '{name}' (this node is '{node.name}')")
        here = any(s.name == name for s in node.sessions)
        if (
            scope == "connection"
            and not here
            and await cluster_views.remote_one(node, user, "connections", name) is None
        ):
            raise HTTPException(404, f"no open connection '{name}'")
        if scope == "client" and not name:
            raise HTTPException(404, "no client given")
        if scope == "vhost" and vhost not in node.vhosts:
            raise HTTPException(404, f"no vhost '{vhost}'")
        if scope == "queue":
            if vhost not in node.vhosts:
                raise HTTPException(404, f"no vhost '{vhost}'")
            if name not in node.vhosts[vhost].queues:
                raise HTTPException(404, f"no queue '{name}' in vhost '{vhost}'")
        return key

    async def put(self, key: Key, body: ControlBody, user: User) -> Response | dict[str, Any]:
        changes = body.model_dump(include=body.model_fields_set)
        if not changes:
            raise HTTPException(
                400,
                "give at least one of state, rate_msgs, rate_bytes, publish_rate_msgs,"
                " publish_rate_bytes",
            )
        if key[0] == "queue" and {"publish_rate_msgs", "publish_rate_bytes"} & set(changes):
            raise HTTPException(400, "publish rates apply to global, node, vhost, client and"
                                " connection scopes, not to a queue")  # fmt: skip
        control = await self.controls.update(await self.checked(key, user), changes, user.name)
        if control.is_empty:
            return Response(status_code=204)
        return control_json(control, self.controls)

    async def delete(self, key: Key) -> Response:
        if not await self.controls.clear(key):
            raise HTTPException(404, "no control at this scope")
        return Response(status_code=204)

    def get(self, key: Key) -> dict[str, Any]:
        control = self.controls.get(key)
        if control is None:
            raise HTTPException(404, "no control at this scope")
        return control_json(control, self.controls)


def routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    monitoring = Depends(requires(MONITORING, node))
    administrator = Depends(requires(ADMINISTRATOR, node))
    scopes = _ScopeControls(node)
    _global_routes(router, scopes, monitoring, administrator)
    _named_scope_routes(router, scopes, monitoring, administrator)
    _vhost_and_queue_routes(router, scopes, monitoring, administrator)
    return router


def _global_routes(
    router: APIRouter, scopes: _ScopeControls, monitoring: Any, administrator: Any
) -> None:
    """The list of every control, then the global scope's GET/PUT/DELETE."""
    controls = scopes.controls

    @router.get("/api/controls", summary="Every consumption control in force")
    async def list_controls(_user: User = monitoring) -> list[dict[str, Any]]:
        return [control_json(c, controls) for c in controls.all()]

    # One GET/PUT/DELETE triple per scope; the path says which.
    @router.get("/api/controls/global", summary="The global control")
    async def get_global(_user: User = monitoring) -> dict[str, Any]:
        return scopes.get(key_of("global"))

    @router.put(
        "/api/controls/global",
        response_model=None,
        summary="Stop, start or throttle every consumer",
    )
    async def put_global(
        body: Annotated[ControlBody, Body()], user: User = administrator
    ) -> Response | dict[str, Any]:
        return await scopes.put(key_of("global"), body, user)

    @router.delete("/api/controls/global", status_code=204, summary="Clear the global control")
    async def delete_global(_user: User = administrator) -> Response:
        return await scopes.delete(key_of("global"))


def _named_scope_routes(
    router: APIRouter, scopes: _ScopeControls, monitoring: Any, administrator: Any
) -> None:
    """The node, client and connection scopes: each named by one string."""

    def add_named_scope(segment: str, scope: ControlScope, what: str) -> None:
        """GET/PUT/DELETE /api/controls/{segment}/{name} for a scope named by one string."""

        @router.get(f"/api/controls/{segment}/{{name}}", summary=f"The control of {what}")
        async def get_named(name: str, _user: User = monitoring) -> dict[str, Any]:
            return scopes.get(key_of(scope, name=name))

        @router.put(
            f"/api/controls/{segment}/{{name}}",
            response_model=None,
            summary=f"Stop, start or throttle {what}",
        )
        async def put_named(
            name: str, body: Annotated[ControlBody, Body()], user: User = administrator
        ) -> Response | dict[str, Any]:
            return await scopes.put(key_of(scope, name=name), body, user)

        @router.delete(
            f"/api/controls/{segment}/{{name}}", status_code=204, summary=f"Clear {what}'s"
        )
        async def delete_named(name: str, _user: User = administrator) -> Response:
            return await scopes.delete(key_of(scope, name=name))

    add_named_scope("nodes", "node", "one gateway node")
    add_named_scope(
        "clients",
        "client",
        "every connection with this connection_name or source address, now and later",
    )
    add_named_scope("connections", "connection", "one open connection ('127.0.0.1:51234 -> …')")


def _vhost_and_queue_routes(
    router: APIRouter, scopes: _ScopeControls, monitoring: Any, administrator: Any
) -> None:
    @router.get("/api/controls/vhosts/{vhost}", summary="A vhost's control")
    async def get_vhost(vhost: str, _user: User = monitoring) -> dict[str, Any]:
        return scopes.get(key_of("vhost", vhost))

    @router.put(
        "/api/controls/vhosts/{vhost}",
        response_model=None,
        summary="Stop, start or throttle the connections of a vhost",
    )
    async def put_vhost(
        vhost: str, body: Annotated[ControlBody, Body()], user: User = administrator
    ) -> Response | dict[str, Any]:
        return await scopes.put(key_of("vhost", vhost), body, user)

    @router.delete("/api/controls/vhosts/{vhost}", status_code=204, summary="Clear it")
    async def delete_vhost(vhost: str, _user: User = administrator) -> Response:
        return await scopes.delete(key_of("vhost", vhost))

    @router.get("/api/controls/queues/{vhost}/{name}", summary="A queue's control")
    async def get_queue(vhost: str, name: str, _user: User = monitoring) -> dict[str, Any]:
        return scopes.get(key_of("queue", vhost, name))

    @router.put(
        "/api/controls/queues/{vhost}/{name}",
        response_model=None,
        summary="Stop, start or throttle a queue",
    )
    async def put_queue(
        vhost: str, name: str, body: Annotated[ControlBody, Body()], user: User = administrator
    ) -> Response | dict[str, Any]:
        return await scopes.put(key_of("queue", vhost, name), body, user)

    @router.delete("/api/controls/queues/{vhost}/{name}", status_code=204, summary="Clear it")
    async def delete_queue(vhost: str, name: str, _user: User = administrator) -> Response:
        return await scopes.delete(key_of("queue", vhost, name))
