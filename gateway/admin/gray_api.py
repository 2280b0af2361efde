"""Gray release rules over HTTP (gateway/features/gray.py applies them).

``PUT /api/gray/rules/{name}`` with ``{"match": {"connection_name": GLOB, "user": U,
"address": IP_OR_CIDR}, "gray": true|false, "switch": true|false|null, "drain": bool}``
creates (201) or replaces (204) the rule; ``match`` and ``gray`` are required, every match
key is optional (``{}`` matches every connection). ``DELETE`` removes it (404 if absent);
``GET /api/gray/rules`` lists them; ``GET /api/gray/rules/{name}`` shows one with this
gateway's ``status`` of it. An unknown field, a value of the wrong type or an address that is
neither an IP address nor a CIDR block is a 400. ``set_at`` is the server's: the time of the
PUT (a body that gives one is refused). Reading needs ``monitoring``, changing
``administrator``, as for the consumption controls (gateway/admin/controls_api.py).

Ending a queue's gray release (docs/gray.md), with the vhost and queue as in
``/api/queues/{vhost}/{name}`` (``%2F`` is "/"): ``POST /api/gray/queues/{vhost}/{name}/end``
records where the gray partitions end now and takes them away at once (202 with the record;
200 with the stored record if it had ended already; 400 if the queue has no gray partitions);
``GET /api/gray/queues/{vhost}/{name}`` shows the queue's gray partitions (``gray_partitions``
as its argument or policy configure them, ``gray_now`` in force) and, once ended, ``status``:
the messages per former gray partition stored before the end and not yet settled, and
``left`` in all; ``DELETE /api/gray/queues/{vhost}/{name}/end`` resumes gray release (204, 404
if it had not ended). Unknown vhost or queue: 404.
"""

from __future__ import annotations

import ipaddress
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import anyio
from fastapi import APIRouter, Body, Depends, HTTPException, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, StrictBool, StrictStr, field_validator, model_validator

from gateway.admin.auth import ADMINISTRATOR, MONITORING, requires
from gateway.admin.cluster_views import elsewhere, rows
from gateway.admin.paths import SlashRoute
from gateway.controls import utc_now_iso
from gateway.features.gray import end_ends, end_progress
from gateway.queues.behaviour import behaviour_of
from meta.errors import NotFound
from meta.models import GrayEnd, GrayMatch, GrayRule, User

if TYPE_CHECKING:
    from gateway.node import Node
    from gateway.queues.runtime import QueueRuntime


class GrayMatchBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    connection_name: StrictStr | None = None
    user: StrictStr | None = None
    address: StrictStr | None = None

    @field_validator("address")
    @classmethod
    def _ip_or_cidr(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:  # strict: "10.1.2.3/8" (host bits set) is more likely a typo than meant
            ipaddress.ip_network(value, strict=True)
        except ValueError as error:
            raise ValueError(
                f"{value!r} is neither an IP address nor a CIDR block ({error})"
            ) from None
        return value


class GrayRuleBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    match: GrayMatchBody
    gray: StrictBool
    switch: StrictBool | None = None
    drain: StrictBool = False

    @model_validator(mode="before")
    @classmethod
    def _no_set_at(cls, data: Any) -> Any:
        if isinstance(data, dict) and "set_at" in data:
            raise ValueError("set_at is set by the server (the time of the PUT): leave it out")
        return data

    def rule(self, name: str) -> GrayRule:
        match = GrayMatch(**self.match.model_dump())
        return GrayRule(
            name=name,
            match=match,
            gray=self.gray,
            switch=self.switch,
            drain=self.drain,
            set_at=utc_now_iso(),
        )


VIEWS_STALE_S = 2.5  # the other gateways' views are rewritten every second


def routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    monitoring = Depends(requires(MONITORING, node))
    administrator = Depends(requires(ADMINISTRATOR, node))

    @router.get("/api/gray/rules", summary="Every gray release rule")
    async def list_rules(_user: User = monitoring) -> list[dict[str, Any]]:
        return [rule.model_dump() for rule in await node.meta.list_gray_rules()]

    @router.get("/api/gray/rules/{name}", summary="A gray rule and what it does here now")
    async def get_rule(name: str, _user: User = monitoring) -> dict[str, Any]:
        rule = await node.meta.get_gray_rule(name)
        if rule is None:
            raise HTTPException(404, f"no gray rule '{name}'")
        return {**rule.model_dump(), "status": await _status_everywhere(node, rule)}

    @router.put(
        "/api/gray/rules/{name}",
        status_code=204,
        summary="Create (201) or replace (204) a gray rule",
    )
    async def put_rule(
        name: str, body: Annotated[GrayRuleBody, Body()], _user: User = administrator
    ) -> Response:
        # Check then set: two PUTs racing for a new name may both answer 201; either way
        # the last one's rule is stored.
        existed = await node.meta.get_gray_rule(name) is not None
        rule = body.rule(name)
        await node.meta.set_gray_rule(rule)
        node.gray.rule_set(rule)  # the feed brings it too: idempotent
        return Response(status_code=204 if existed else 201)

    @router.delete("/api/gray/rules/{name}", status_code=204, summary="Remove a gray rule")
    async def delete_rule(name: str, _user: User = administrator) -> Response:
        if not await node.meta.delete_gray_rule(name):
            raise HTTPException(404, f"no gray rule '{name}'")
        node.gray.rule_deleted(name)
        return Response(status_code=204)

    add_end_routes(router, node)
    return router


async def _status_everywhere(node: Node, rule: GrayRule) -> dict[str, Any]:
    """This gateway's status of the rule, and the other gateways' connections it decides as
    their management views show them (cluster): a connection still switching back there is
    pending. Those views are up to a second old, so for ``VIEWS_STALE_S`` after the rule
    was set the others are taken to be pending too (a switch back just begun there may not
    show yet)."""
    status = node.gray.status(rule.name)
    if node.cluster is None:
        return status
    connections: list[Any] = list(status["connections"])
    pending: list[Any] = list(status["pending"])
    for row in rows(await elsewhere(node), "connections"):
        gray = (row.get("mqgw") or {}).get("gray") or {}
        if gray.get("rule") != rule.name:
            continue
        connections.append(row.get("name"))
        if gray.get("switching_back"):
            pending.append({"connection": row.get("name"), "node": row.get("node"),
                            "waiting_for": "its gray partitions to drain"})  # fmt: skip
    if rule.drain and not rule.gray and _age_s(rule.set_at) < VIEWS_STALE_S:
        pending.append({"waiting_for": "the other gateways' views of the switch back"})
    return {"connections": sorted(c for c in connections if c), "pending": pending}


def _age_s(set_at: str) -> float:
    try:
        when = datetime.fromisoformat(set_at.replace("Z", "+00:00"))
    except ValueError:
        return float("inf")
    return (datetime.now(UTC) - when).total_seconds()


def _queue(node: Node, vhost: str, name: str) -> QueueRuntime:
    host = node.vhosts.get(vhost)
    if host is None:
        raise HTTPException(404, f"no vhost '{vhost}'")
    queue = host.queues.get(name)
    if queue is None:
        raise HTTPException(404, f"no queue '{name}' in vhost '{vhost}'")
    return queue


def _configured_gray_partitions(node: Node, queue: QueueRuntime) -> int:
    """K as the queue's argument or policy give it, the end aside (its behaviour has 0)."""
    policy = node.vhosts[queue.definition.vhost].policy_for(queue.name)
    definition = None if policy is None else policy.definition
    return behaviour_of(queue.definition.arguments, definition).gray_partitions


def add_end_routes(router: APIRouter, node: Node) -> None:
    """/api/gray/queues/{vhost}/{name}[/end]: ending a queue's gray release."""
    monitoring = Depends(requires(MONITORING, node))
    administrator = Depends(requires(ADMINISTRATOR, node))
    # Ends on this gateway one at a time: a second waits and finds the first's record (the
    # queue has no gray partitions left to read ends from by then).
    ending = anyio.Lock()

    @router.post(
        "/api/gray/queues/{vhost}/{name}/end",
        status_code=202,
        summary="End a queue's gray release (202; 200 if it had ended already)",
    )
    async def end_gray(vhost: str, name: str, _user: User = administrator) -> JSONResponse:
        async with ending:
            queue = _queue(node, vhost, name)
            stored = await node.meta.get_gray_end(vhost, name)
            if stored is not None:
                return JSONResponse(stored.model_dump(), status_code=200)
            if not queue.gray_parts:
                raise HTTPException(
                    400, f"queue '{name}' in vhost '{vhost}' has no gray partitions"
                )
            ends = await end_ends(queue)
            end = GrayEnd(vhost=vhost, queue=name, ends=ends, set_at=utc_now_iso())
            try:
                await node.meta.set_gray_end(end)
            except NotFound:  # deleted meanwhile
                raise HTTPException(404, f"no queue '{name}' in vhost '{vhost}'") from None
            node.gray.end_set(end)  # the feed brings it too: idempotent
            return JSONResponse(end.model_dump(), status_code=202)

    @router.get(
        "/api/gray/queues/{vhost}/{name}",
        summary="A queue's gray partitions, and once its gray release ended, how far drained",
    )
    async def gray_queue(vhost: str, name: str, _user: User = monitoring) -> dict[str, Any]:
        queue = _queue(node, vhost, name)
        end = await node.meta.get_gray_end(vhost, name)
        return {
            "vhost": vhost,
            "queue": name,
            "gray_partitions": _configured_gray_partitions(node, queue),
            "gray_now": list(queue.gray_parts),
            "ended": end is not None,
            "set_at": None if end is None else end.set_at,
            "status": None if end is None else await end_progress(queue, end.ends),
        }

    @router.delete(
        "/api/gray/queues/{vhost}/{name}/end",
        status_code=204,
        summary="Resume a queue's gray release",
    )
    async def resume_gray(vhost: str, name: str, _user: User = administrator) -> Response:
        _queue(node, vhost, name)
        removed = await node.meta.delete_gray_end(vhost, name)
        # This gateway may still hold an end the store dropped with a former queue of the
        # name (an embedded node hears of no deletion): resuming clears it too.
        if not removed and (vhost, name) not in node.gray.ends:
            raise HTTPException(
                404, f"gray release of queue '{name}' in vhost '{vhost}' has not ended"
            )
        node.gray.end_deleted(vhost, name)
        return Response(status_code=204)
