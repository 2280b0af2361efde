"""Exchanges, bindings and queue declarations in RabbitMQ 3.10's management shapes, as
``rabbitmqadmin`` calls them: list, declare (PUT; a binding is a POST), delete, purge.

Writes need the ``management`` tag and the vhost permission AMQP would need (configure to
declare or delete, read and write to bind, read to purge); a missing permission is a 401
"Access refused.", as the plugin answers. What AMQP refuses (an inequivalent redeclare, an
unknown exchange type, a reserved name) is a 400 with the same text; what does not exist a 404.
"""

from __future__ import annotations

import base64
import hashlib
import json
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any, TypeVar
from urllib.parse import quote

from fastapi import APIRouter, Body, Depends, HTTPException, Request, Response

from gateway.admin import pagination
from gateway.admin.auth import MANAGEMENT, requires
from gateway.admin.connections_api import json_value
from gateway.admin.paths import SlashRoute
from gateway.admin.queues_api import may_see, visible_vhost
from gateway.amqp.errors import AMQPError
from meta.models import BindingDef, DestinationType, ExchangeDef, QueueDef, User

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from gateway.node import Node
    from gateway.sessions.access import Kind

T = TypeVar("T")
DEFAULT_EXCHANGE_ALIAS = "amq.default"  # how the plugin's URLs name the default exchange ""
Json = Annotated[dict[str, Any], Body()]
OptionalJson = Annotated[dict[str, Any] | None, Body()]


def exchange_json(definition: ExchangeDef) -> dict[str, Any]:
    return {
        "name": definition.name,
        "vhost": definition.vhost,
        "type": definition.type,
        "durable": definition.durable,
        "auto_delete": definition.auto_delete,
        "internal": definition.internal,
        "arguments": json_value(definition.arguments),
    }


def properties_key(routing_key: str, arguments: dict[str, Any]) -> str:
    """rabbit_mgmt_format:pack_binding_props: '~' for an empty key without arguments, the
    key otherwise, plus '~' and a hash of the arguments when there are some."""
    if not arguments:
        return quote(routing_key, safe="") if routing_key else "~"
    text = json.dumps(json_value(arguments), sort_keys=True).encode()
    digest = base64.urlsafe_b64encode(hashlib.sha256(text).digest()[:6]).decode()
    return f"{quote(routing_key, safe='')}~{digest}"


def binding_json(binding: BindingDef) -> dict[str, Any]:
    return {
        "source": binding.source,
        "vhost": binding.vhost,
        "destination": binding.destination,
        "destination_type": binding.destination_type,
        "routing_key": binding.routing_key,
        "arguments": json_value(binding.arguments),
        "properties_key": properties_key(binding.routing_key, binding.arguments),
    }


def _default_binding(vhost: str, queue: str) -> dict[str, Any]:
    """RabbitMQ lists every queue's implicit binding to the default exchange."""
    return binding_json(
        BindingDef(
            vhost=vhost, source="", destination=queue, destination_type="queue", routing_key=queue
        )
    )


def flag(body: dict[str, Any], name: str, default: bool) -> bool:
    """A boolean field; rabbitmqadmin sends "true"/"false" as strings."""
    value = body.get(name, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise HTTPException(400, f"{name} must be true or false, got {value!r}")


def arguments_of(body: dict[str, Any]) -> dict[str, Any]:
    arguments = body.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise HTTPException(400, "arguments must be a JSON object")
    return arguments


async def amqp_call(call: Awaitable[T]) -> T:
    """Run a broker operation; its AMQP error becomes the plugin's HTTP answer."""
    try:
        return await call
    except AMQPError as error:
        reason = error.reply_text.split(" - ", 1)[-1]
        raise HTTPException(404 if error.reply_code == 404 else 400, reason) from None


def routes(node: Node) -> APIRouter:
    """Exchanges, then bindings, then queue declarations (the order routes are matched in)."""
    router = APIRouter(route_class=SlashRoute)
    for part in (_exchange_routes, _binding_routes, _queue_routes):
        router.include_router(part(node))
    return router


def _permit(node: Node, user: User, vhost: str, kind: Kind, name: str) -> None:
    if not node.access.grants(user.name, vhost).check(kind, name):
        raise HTTPException(401, "Access refused.")


def exchange_name(name: str) -> str:
    return "" if name == DEFAULT_EXCHANGE_ALIAS else name


async def _bindings_of(node: Node, vhost: str) -> list[dict[str, Any]]:
    host = node.vhosts[vhost]
    implicit = [_default_binding(vhost, q) for q in host.queues]
    return implicit + [binding_json(b) for b in await node.meta.list_bindings(vhost)]


async def _between(
    node: Node, vhost: str, source: str, kind: str, destination: str
) -> list[dict[str, Any]]:
    if kind not in ("q", "e"):
        raise HTTPException(404, f"no such binding kind '{kind}' (q or e)")
    if await node.meta.get_exchange(vhost, exchange_name(source)) is None:
        raise HTTPException(404, f"no exchange '{source}' in vhost '{vhost}'")
    long_kind = "queue" if kind == "q" else "exchange"
    return [
        b
        for b in await _bindings_of(node, vhost)
        if b["source"] == exchange_name(source)
        and b["destination_type"] == long_kind
        and b["destination"] == destination
    ]


async def _one_binding(
    node: Node, vhost: str, source: str, kind: str, destination: str, props: str
) -> dict[str, Any]:
    for found in await _between(node, vhost, source, kind, destination):
        if found["properties_key"] == quote(props, safe="") or (
            props == "~" and found["properties_key"] == "~"
        ):
            return found
    raise HTTPException(404, f"no binding '{props}' from '{source}' to '{destination}'")


def _exchange_routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    management = Depends(requires(MANAGEMENT, node))
    vhost_or_404 = partial(visible_vhost, node)
    permit = partial(_permit, node)

    async def exchanges_of(vhosts: list[str]) -> list[dict[str, Any]]:
        return [exchange_json(x) for v in vhosts for x in await node.meta.list_exchanges(v)]

    @router.get("/api/exchanges", summary="Every exchange (of the vhosts the user may see)")
    async def exchanges(request: Request, user: User = management) -> Any:
        visible = [v for v in node.vhosts if may_see(node, user, v)]
        return pagination.apply(request, await exchanges_of(visible))

    @router.get("/api/exchanges/{vhost}", summary="The exchanges of one vhost")
    async def vhost_exchanges(request: Request, vhost: str, user: User = management) -> Any:
        vhost_or_404(vhost, user)
        return pagination.apply(request, await exchanges_of([vhost]))

    @router.get("/api/exchanges/{vhost}/{name}", summary="One exchange")
    async def exchange(request: Request, vhost: str, name: str, user: User = management) -> Any:
        vhost_or_404(vhost, user)
        found = await node.meta.get_exchange(vhost, exchange_name(name))
        if found is None:
            raise HTTPException(404, f"no exchange '{name}' in vhost '{vhost}'")
        return pagination.one(request, {**exchange_json(found), "incoming": [], "outgoing": []})

    @router.put("/api/exchanges/{vhost}/{name}", summary="Declare an exchange (201, or 204)")
    async def put_exchange(vhost: str, name: str, body: Json, user: User = management) -> Response:
        host = vhost_or_404(vhost, user)
        permit(user, vhost, "configure", name)
        if "type" not in body:
            raise HTTPException(400, "type is required")
        existed = await node.meta.get_exchange(vhost, name) is not None
        definition = ExchangeDef(
            vhost=vhost,
            name=name,
            type=str(body["type"]),
            durable=flag(body, "durable", False),  # the plugin's default
            auto_delete=flag(body, "auto_delete", False),
            internal=flag(body, "internal", False),
            arguments=arguments_of(body),
        )
        await amqp_call(host.declare_exchange(definition, passive=False))
        return Response(status_code=204 if existed else 201)

    @router.delete("/api/exchanges/{vhost}/{name}", status_code=204, summary="Delete one")
    async def delete_exchange(
        request: Request, vhost: str, name: str, user: User = management
    ) -> Response:
        host = vhost_or_404(vhost, user)
        permit(user, vhost, "configure", name)
        if await node.meta.get_exchange(vhost, name) is None:
            raise HTTPException(404, f"no exchange '{name}' in vhost '{vhost}'")
        if_unused = request.query_params.get("if-unused") == "true"
        await amqp_call(host.delete_exchange(name, if_unused))
        return Response(status_code=204)

    return router


def _binding_routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    management = Depends(requires(MANAGEMENT, node))
    vhost_or_404 = partial(visible_vhost, node)
    permit = partial(_permit, node)

    binding_order = ("vhost", "source", "destination_type", "destination", "routing_key")

    @router.get("/api/bindings", summary="Every binding (of the vhosts the user may see)")
    async def bindings(request: Request, user: User = management) -> Any:
        rows = [
            b
            for v in list(node.vhosts)
            if may_see(node, user, v)
            for b in await _bindings_of(node, v)
        ]
        return pagination.apply(request, rows, binding_order)

    @router.get("/api/bindings/{vhost}", summary="The bindings of one vhost")
    async def vhost_bindings(request: Request, vhost: str, user: User = management) -> Any:
        vhost_or_404(vhost, user)
        return pagination.apply(request, await _bindings_of(node, vhost), binding_order)

    @router.get("/api/bindings/{vhost}/e/{source}/{kind}/{destination}")
    async def bindings_between(
        vhost: str, source: str, kind: str, destination: str, user: User = management
    ) -> list[dict[str, Any]]:
        vhost_or_404(vhost, user)
        return await _between(node, vhost, source, kind, destination)

    @router.post("/api/bindings/{vhost}/e/{source}/{kind}/{destination}", status_code=201)
    async def bind(
        vhost: str, source: str, kind: str, destination: str, body: OptionalJson = None,
        user: User = management,
    ) -> Response:  # fmt: skip
        host = vhost_or_404(vhost, user)
        body = body or {}
        await _between(node, vhost, source, kind, destination)  # 404 for an unknown source
        long_kind: DestinationType = "queue" if kind == "q" else "exchange"
        permit(user, vhost, "write", destination)
        permit(user, vhost, "read", exchange_name(source))
        binding = BindingDef(
            vhost=vhost,
            source=exchange_name(source),
            destination=destination,
            destination_type=long_kind,
            routing_key=str(body.get("routing_key", "")),
            arguments=arguments_of(body),
        )
        await amqp_call(host.bind(binding, "", *((50, 20) if kind == "q" else (40, 30))))
        location = properties_key(binding.routing_key, binding.arguments)
        return Response(status_code=201, headers={"Location": location})

    @router.get("/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}")
    async def binding(
        vhost: str, source: str, kind: str, destination: str, props: str, user: User = management
    ) -> dict[str, Any]:
        vhost_or_404(vhost, user)
        return await _one_binding(node, vhost, source, kind, destination, props)

    @router.delete("/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}")
    async def unbind(
        vhost: str, source: str, kind: str, destination: str, props: str, user: User = management
    ) -> Response:
        host = vhost_or_404(vhost, user)
        found = await _one_binding(node, vhost, source, kind, destination, props)
        permit(user, vhost, "write", destination)
        permit(user, vhost, "read", found["source"])
        binding = BindingDef(
            vhost=vhost,
            source=found["source"],
            destination=destination,
            destination_type="queue" if kind == "q" else "exchange",
            routing_key=found["routing_key"],
            arguments=found["arguments"],
        )
        await amqp_call(host.unbind(binding, "", *((50, 50) if kind == "q" else (40, 40))))
        return Response(status_code=204)

    return router


def _queue_routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    management = Depends(requires(MANAGEMENT, node))
    vhost_or_404 = partial(visible_vhost, node)
    permit = partial(_permit, node)

    @router.get("/api/queues/{vhost}/{name}/bindings", summary="The bindings to one queue")
    async def queue_bindings(vhost: str, name: str, user: User = management) -> Any:
        if name not in vhost_or_404(vhost, user).queues:
            raise HTTPException(404, f"no queue '{name}' in vhost '{vhost}'")
        return [
            b
            for b in await _bindings_of(node, vhost)
            if b["destination_type"] == "queue" and b["destination"] == name
        ]

    @router.put("/api/queues/{vhost}/{name}", summary="Declare a queue (201, or 204)")
    async def put_queue(
        vhost: str, name: str, body: OptionalJson = None, user: User = management
    ) -> Response:
        host = vhost_or_404(vhost, user)
        body = body or {}
        permit(user, vhost, "configure", name)
        existed = name in host.queues
        definition = host.with_partitions(
            QueueDef(
                vhost=vhost,
                name=name,
                durable=flag(body, "durable", False),  # the plugin's default
                auto_delete=flag(body, "auto_delete", False),
                arguments=arguments_of(body),
            )
        )
        await amqp_call(host.declare_queue(definition, passive=False, connection_id=""))
        return Response(status_code=204 if existed else 201)

    @router.delete("/api/queues/{vhost}/{name}", status_code=204, summary="Delete a queue")
    async def delete_queue(
        request: Request, vhost: str, name: str, user: User = management
    ) -> Response:
        host = vhost_or_404(vhost, user)
        permit(user, vhost, "configure", name)
        queue = host.queues.get(name)
        if queue is None:
            raise HTTPException(404, f"no queue '{name}' in vhost '{vhost}'")
        where = f"queue '{name}' in vhost '{vhost}'"
        if request.query_params.get("if-unused") == "true" and queue.consumers:
            raise HTTPException(400, f"{where} in use")
        if request.query_params.get("if-empty") == "true" and await queue.message_count():
            raise HTTPException(400, f"{where} not empty")
        await amqp_call(host.delete_queue(name, None, check=False))
        return Response(status_code=204)

    @router.delete("/api/queues/{vhost}/{name}/contents", status_code=204, summary="Purge")
    async def purge_queue(vhost: str, name: str, user: User = management) -> Response:
        queue = vhost_or_404(vhost, user).queues.get(name)
        if queue is None:
            raise HTTPException(404, f"no queue '{name}' in vhost '{vhost}'")
        permit(user, vhost, "read", name)
        await node.broadcasts.purge(queue)
        return Response(status_code=204)

    return router
