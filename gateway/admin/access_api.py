"""Users, vhosts and permissions in the management API's shapes (RabbitMQ 3.10):
``/api/users``, ``/api/vhosts``, ``/api/permissions``, ``/api/whoami``.

Writes need ``administrator``; a ``management`` user sees the vhosts it holds permissions in
and its own permissions. A PUT that creates answers 201, one that replaces 204 (RabbitMQ).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Body, Depends, HTTPException, Response
from pydantic import BaseModel, ConfigDict, StrictBool, field_validator

from gateway.admin.auth import ADMINISTRATOR, MANAGEMENT, granted, reads_everything, requires
from gateway.admin.paths import SlashRoute
from gateway.observe.stats import QueueCounts, queue_counts
from gateway.sessions import taps
from meta.definitions_export import permission_entry, user_entry
from meta.group_pins import PinInvalid, parse_groups
from meta.models import Permission, User, VHost
from meta.password import SHA256_ALGORITHM, hash_password

if TYPE_CHECKING:
    from gateway.node import Node
    from gateway.queues.runtime import QueueRuntime


class UserBody(BaseModel):
    """PUT /api/users/{name}: a password, or a hash from another RabbitMQ (or neither:
    a user that cannot log in with a password, as RabbitMQ allows)."""

    model_config = ConfigDict(extra="ignore")
    password: str | None = None
    password_hash: str | None = None
    hashing_algorithm: str = SHA256_ALGORITHM
    tags: str | list[str] = ""


class VHostBody(BaseModel):
    """PUT /api/vhosts/{name}: creates, or replaces description and tags; ``tracing``
    switches the firehose (absent: left as it is), as RabbitMQ 3.10 does."""

    model_config = ConfigDict(extra="ignore")
    description: str = ""
    tags: str | list[str] = ""
    tracing: StrictBool | None = None  # RabbitMQ answers "yes" with 400 not_boolean
    # mqgw: the broker groups its queues are pinned to (meta/group_pins.py); absent: kept,
    # [] or "": none.
    default_groups: str | list[str] | None = None


class PermissionBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    configure: str
    write: str
    read: str

    @field_validator("configure", "write", "read")
    @classmethod
    def _a_regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as error:
            raise ValueError(f"not a regular expression: {error}") from None
        return value


def split_tags(tags: str | list[str]) -> tuple[str, ...]:
    """RabbitMQ takes tags as "a,b" or ["a", "b"]."""
    items = tags.split(",") if isinstance(tags, str) else tags
    return tuple(t.strip() for t in items if t.strip())


def vhost_json(
    vhost: VHost, node: Node | None = None, counts: dict[int, QueueCounts] | None = None
) -> dict[str, Any]:
    """``counts``: queue_counts of (at least) the vhost's queues, for its message counts."""
    body: dict[str, Any] = {
        "name": vhost.name,
        "description": vhost.description,
        "tags": list(vhost.tags),
        "metadata": {"description": vhost.description, "tags": list(vhost.tags)},
        "tracing": vhost.tracing,
        "default_groups": list(vhost.default_groups),
    }
    opened = None if node is None else node.vhosts.get(vhost.name)
    if opened is not None and counts is not None:  # as RabbitMQ (rabbitmqadmin list vhosts)
        mine = [counts[q.queue_id] for q in opened.queues.values() if q.queue_id in counts]
        ready = sum(c.ready for c in mine)
        unacked = sum(c.unacked for c in mine)
        body |= {
            "messages": ready + unacked,
            "messages_ready": ready,
            "messages_unacknowledged": unacked,
        }
    return body


def node_queues(node: Node, vhosts: list[str]) -> list[QueueRuntime]:
    """The queue runtimes of those of ``vhosts`` open on the node."""
    return [q for name in vhosts if (v := node.vhosts.get(name)) for q in v.queues.values()]


def routes(node: Node) -> APIRouter:
    """Who am I, then users, vhosts and permissions (the order routes are matched in)."""
    router = APIRouter(route_class=SlashRoute)
    management = Depends(requires(MANAGEMENT, node))

    @router.get("/api/whoami", summary="The authenticated user and its tags")
    async def whoami(user: User = management) -> dict[str, Any]:
        return {"name": user.name, "tags": list(user.tags)}

    for part in (_user_routes, _vhost_routes, _permission_routes):
        router.include_router(part(node))
    return router


async def _user_or_404(node: Node, name: str) -> User:
    user = await node.meta.get_user(name)
    if user is None:
        raise HTTPException(404, f"no user '{name}'")
    return user


def _vhost_exists(node: Node, name: str) -> None:
    if name not in node.vhosts:
        raise HTTPException(404, f"no vhost '{name}'")


def _user_routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    administrator = Depends(requires(ADMINISTRATOR, node))

    @router.get("/api/users", summary="Every user (administrator)")
    async def users(_user: User = administrator) -> list[dict[str, Any]]:
        return [user_entry(u) for u in await node.meta.list_users()]

    @router.get("/api/users/{name}", summary="One user (administrator)")
    async def get_user(name: str, _user: User = administrator) -> dict[str, Any]:
        return user_entry(await _user_or_404(node, name))

    @router.put("/api/users/{name}", summary="Create or replace a user (administrator)")
    async def put_user(
        name: str, body: Annotated[UserBody, Body()], _user: User = administrator
    ) -> Response:
        existing = await node.meta.get_user(name)
        if body.password is not None:
            password_hash, algorithm = hash_password(body.password), SHA256_ALGORITHM
        elif body.password_hash is not None:
            password_hash, algorithm = body.password_hash, body.hashing_algorithm
        elif existing is not None:  # tags only: keep the password, as RabbitMQ does
            password_hash, algorithm = existing.password_hash, existing.hashing_algorithm
        else:
            password_hash, algorithm = "", SHA256_ALGORITHM
        user = User(
            name=name,
            password_hash=password_hash,
            hashing_algorithm=algorithm,
            tags=split_tags(body.tags),
        )
        await node.access.put_user(user)
        return Response(status_code=204 if existing else 201)

    @router.delete("/api/users/{name}", status_code=204, summary="Delete a user")
    async def delete_user(name: str, _user: User = administrator) -> Response:
        if not await node.access.delete_user(name):
            raise HTTPException(404, f"no user '{name}'")
        return Response(status_code=204)

    @router.get("/api/users/{name}/permissions", summary="A user's permissions")
    async def user_permissions(name: str, _user: User = administrator) -> list[dict[str, Any]]:
        await _user_or_404(node, name)
        return [permission_entry(p) for p in await node.meta.list_permissions() if p.user == name]

    return router


def _vhost_routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    management = Depends(requires(MANAGEMENT, node))
    administrator = Depends(requires(ADMINISTRATOR, node))

    @router.get("/api/vhosts", summary="The vhosts the user may see")
    async def vhosts(user: User = management) -> list[dict[str, Any]]:
        shown = [
            v
            for v in await node.meta.list_vhosts()
            if reads_everything(user) or node.access.may_use_vhost(user.name, v.name)
        ]
        counts = await queue_counts(node_queues(node, [v.name for v in shown]))
        return [vhost_json(v, node, counts) for v in shown]

    @router.get("/api/vhosts/{name}", summary="One vhost")
    async def get_vhost(name: str, user: User = management) -> dict[str, Any]:
        vhost = await node.meta.get_vhost(name)
        visible = reads_everything(user) or node.access.may_use_vhost(user.name, name)
        if vhost is None or not visible:
            raise HTTPException(404, f"no vhost '{name}'")
        return vhost_json(vhost, node, await queue_counts(node_queues(node, [name])))

    @router.put(
        "/api/vhosts/{name}",
        summary="Create or update a vhost; tracing switches its firehose (administrator)",
    )
    async def put_vhost(
        name: str, body: Annotated[VHostBody, Body()] | None = None, _user: User = administrator
    ) -> Response:
        body = body or VHostBody()
        existing = await node.meta.get_vhost(name)
        tracing = body.tracing
        if tracing is None:
            tracing = existing is not None and existing.tracing
        groups = existing.default_groups if existing is not None else ()
        if body.default_groups is not None:
            try:
                groups = parse_groups(body.default_groups) if body.default_groups else ()
            except PinInvalid as error:
                raise HTTPException(400, f"default_groups: {error}") from None
        definition = VHost(
            name=name, description=body.description, tags=split_tags(body.tags), tracing=tracing,
            default_groups=groups,
        )  # fmt: skip
        if existing is None:
            await node.add_vhost(definition)
        else:
            await node.meta.update_vhost(definition)
        vhost = node.vhosts.get(name)
        if vhost is not None:  # here at once; other gateways follow the change feed
            vhost.default_groups = groups
            await taps.set_firehose(node, vhost, tracing)
        return Response(status_code=204 if existing is not None else 201)

    @router.delete("/api/vhosts/{name}", status_code=204, summary="Delete a vhost and all in it")
    async def delete_vhost(name: str, _user: User = administrator) -> Response:
        _vhost_exists(node, name)
        await node.delete_vhost(name)
        return Response(status_code=204)

    @router.get("/api/vhosts/{name}/permissions", summary="The permissions in a vhost")
    async def vhost_permissions(name: str, _user: User = administrator) -> list[dict[str, Any]]:
        _vhost_exists(node, name)
        return [permission_entry(p) for p in await node.meta.list_permissions(name)]

    return router


def _permission_routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    management = Depends(requires(MANAGEMENT, node))
    administrator = Depends(requires(ADMINISTRATOR, node))

    @router.get("/api/permissions", summary="Every permission (administrator)")
    async def permissions(_user: User = administrator) -> list[dict[str, Any]]:
        return [permission_entry(p) for p in await node.meta.list_permissions()]

    @router.get("/api/permissions/{vhost}/{name}", summary="One user's permission in a vhost")
    async def get_permission(vhost: str, name: str, user: User = management) -> dict[str, Any]:
        if user.name != name and ADMINISTRATOR not in granted(user):
            raise HTTPException(403, "only administrators read other users' permissions")
        permission = await node.meta.get_permission(name, vhost)
        if permission is None:
            raise HTTPException(404, f"user '{name}' has no permission in vhost '{vhost}'")
        return permission_entry(permission)

    @router.put("/api/permissions/{vhost}/{name}", summary="Set a user's permission in a vhost")
    async def put_permission(
        vhost: str,
        name: str,
        body: Annotated[PermissionBody, Body()],
        _user: User = administrator,
    ) -> Response:
        _vhost_exists(node, vhost)
        await _user_or_404(node, name)
        existed = node.access.may_use_vhost(name, vhost)
        await node.access.set_permission(
            Permission(
                user=name, vhost=vhost, configure=body.configure, write=body.write, read=body.read
            )
        )
        return Response(status_code=204 if existed else 201)

    @router.delete("/api/permissions/{vhost}/{name}", status_code=204, summary="Clear it")
    async def delete_permission(vhost: str, name: str, _user: User = administrator) -> Response:
        if not node.access.may_use_vhost(name, vhost):
            raise HTTPException(404, f"user '{name}' has no permission in vhost '{vhost}'")
        await node.access.clear_permission(name, vhost)
        return Response(status_code=204)

    return router
