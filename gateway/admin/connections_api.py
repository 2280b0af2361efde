"""Open AMQP connections (GET /api/connections, RabbitMQ's names for the fields it has), each
with the consumption control in force for it, and their consumers (GET /api/consumers, in
RabbitMQ 3.10's management shape). The full management view comes later."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends

from gateway.admin.auth import MANAGEMENT, reads_everything, requires
from gateway.admin.paths import SlashRoute
from meta.models import User

if TYPE_CHECKING:
    from gateway.channel_state import Consumer
    from gateway.node import Node
    from gateway.session import Session


def _plain(value: Any) -> Any:
    """AMQP field values as JSON can carry them (bytes as text, nested tables kept)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode(errors="replace")
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port) if port.isdigit() else 0


def connection_json(node: Node, session: Session) -> dict[str, Any]:
    peer_host, peer_port = _host_port(session.peer)
    host, port = _host_port(session.local)
    return {
        "name": session.name,
        "node": node.name,
        "vhost": session.vhost.name if session.vhost else None,
        "user": session.user,
        "peer_host": peer_host,
        "peer_port": peer_port,
        "host": host,
        "port": port,
        "protocol": "AMQP 0-9-1",
        "channels": len(session.channels),
        "state": "blocked" if node.alarms.blocked and session.published else "running",
        "client_properties": _plain(session.conn.client_properties),
        "mqgw": {"control": node.controls.effective_for_session(session)},
    }


def consumer_json(node: Node, consumer: Consumer) -> dict[str, Any]:
    """One consumer as RabbitMQ 3.10's management plugin shows it (/api/consumers and the
    queue's consumer_details); ``active`` is false only for a waiting consumer of a
    single-active-consumer queue."""
    channel = consumer.channel
    session = channel.session
    queue = consumer.queue
    status = queue.activity_status(consumer)
    peer_host, peer_port = _host_port(session.peer)
    return {
        "arguments": _plain(dict(consumer.arguments)),
        "ack_required": not consumer.no_ack,
        "active": status != "waiting",
        "activity_status": status,
        "channel_details": {
            "connection_name": session.name,
            "name": f"{session.name} ({channel.number})",
            "node": node.name,
            "number": channel.number,
            "peer_host": peer_host,
            "peer_port": peer_port,
            "user": session.user,
        },
        "consumer_tag": consumer.tag,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch,
        "queue": {"name": queue.name, "vhost": queue.definition.vhost},
    }


def _consumers(node: Node, user: User, vhost: str | None) -> list[dict[str, Any]]:
    """Consumers in the vhosts ``user`` may see (monitoring and administrators: all)."""
    everything = reads_everything(user)
    return [
        consumer_json(node, consumer)
        for session in list(node.sessions)
        if session.vhost is not None
        and (vhost is None or session.vhost.name == vhost)
        and (everything or node.access.may_use_vhost(user.name, session.vhost.name))
        for channel in list(session.channels.values())
        for consumer in list(channel.consumers.values())
    ]


def routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    management = Depends(requires(MANAGEMENT, node))

    @router.get("/api/connections", summary="Open connections (a management user: its own)")
    async def connections(user: User = management) -> list[dict[str, Any]]:
        return [
            connection_json(node, s)
            for s in list(node.sessions)
            if s.opened and (reads_everything(user) or s.user == user.name)
        ]

    @router.get("/api/consumers", summary="Every consumer (of the vhosts the user may see)")
    async def consumers(user: User = management) -> list[dict[str, Any]]:
        return _consumers(node, user, None)

    @router.get("/api/consumers/{vhost}", summary="The consumers of one vhost")
    async def vhost_consumers(vhost: str, user: User = management) -> list[dict[str, Any]]:
        return _consumers(node, user, vhost)

    return router
