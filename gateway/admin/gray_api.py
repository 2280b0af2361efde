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
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Body, Depends, HTTPException, Response
from pydantic import BaseModel, ConfigDict, StrictBool, StrictStr, field_validator, model_validator

from gateway.admin.auth import ADMINISTRATOR, MONITORING, requires
from gateway.admin.paths import SlashRoute
from gateway.controls import utc_now_iso
from meta.models import GrayMatch, GrayRule, User

if TYPE_CHECKING:
    from gateway.node import Node


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
        return {**rule.model_dump(), "status": node.gray.status(name)}

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

    return router
