"""Open AMQP connections (GET /api/connections, RabbitMQ's names for the fields it has), each
with the consumption control in force for it. The full management view comes later."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends

from gateway.admin.auth import MANAGEMENT, reads_everything, requires
from gateway.admin.paths import SlashRoute
from meta.models import User

if TYPE_CHECKING:
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

    return router
