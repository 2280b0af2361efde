"""Open AMQP connections (GET /api/connections, RabbitMQ's names for the fields it has), each
with the consumption control in force for it; closing one (DELETE, 320 CONNECTION_FORCED with
the ``X-Reason`` header's text, as RabbitMQ); channels (/api/channels) and consumers
(/api/consumers), in RabbitMQ 3.10's management shapes. In a cluster every list has every
live gateway's objects, each naming its gateway in ``node`` (gateway/admin/cluster_views.py),
and a connection closes whichever gateway holds it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Request, Response

from gateway.admin import cluster_views, pagination
from gateway.admin.auth import MANAGEMENT, reads_everything, requires
from gateway.admin.paths import SlashRoute
from gateway.amqp.errors import ConnectionForced
from meta.models import User

if TYPE_CHECKING:
    from gateway.node import Node
    from gateway.sessions.channel_state import ChannelState, Consumer
    from gateway.sessions.session import Session


def json_value(value: Any) -> Any:
    """AMQP field values as JSON can carry them (bytes as text, nested tables kept)."""
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
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
        "state": _connection_state(node, session),
        "client_properties": json_value(session.conn.client_properties),
        "auth_mechanism": session.conn.mechanism,
        "frame_max": session.conn.frame_max,
        "channel_max": session.conn.channel_max,
        "timeout": session.conn.heartbeat_s,
        "type": "network",
        "mqgw": {
            "control": node.controls.effective_for_session(session),
            "gray": node.gray.describe(session),
        },
    }


def _connection_state(node: Node, session: Session) -> str:
    """RabbitMQ's: "blocked" by a resource alarm, "flow" while back-pressure holds its
    publishes (publish limits, queues far behind), else "running"."""
    if node.alarms.blocked and session.published:
        return "blocked"
    return "flow" if session.flow_holds else "running"


def channel_json(node: Node, channel: ChannelState) -> dict[str, Any]:
    """One channel as RabbitMQ 3.10's /api/channels shows it (the fields mqgw knows)."""
    session = channel.session
    peer_host, peer_port = _host_port(session.peer)
    state = "running" if channel.flow_active else "flow"
    return {
        "name": f"{session.name} ({channel.number})",
        "number": channel.number,
        "node": node.name,
        "user": session.user,
        "vhost": session.vhost.name if session.vhost else None,
        "connection_details": {
            "name": session.name,
            "peer_host": peer_host,
            "peer_port": peer_port,
        },
        "consumer_count": len(channel.consumers),
        "prefetch_count": channel.prefetch_count,
        "global_prefetch_count": channel.prefetch_global,
        "messages_unacknowledged": len(channel.unacked),
        "messages_uncommitted": len(channel.tx_publishes),
        "acks_uncommitted": len(channel.tx_actions),
        "confirm": channel.confirm_mode,
        "transactional": channel.tx_mode,
        "state": "closing" if channel.closing else state,
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
        "arguments": json_value(dict(consumer.arguments)),
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


def local_objects(node: Node) -> dict[str, list[dict[str, Any]]]:
    """This gateway's connections, channels and consumers, as the other gateways of a
    cluster show them (gateway/admin/cluster_views.py)."""
    sessions = [s for s in list(node.sessions) if s.opened]
    channels = [c for s in sessions for c in list(s.channels.values())]
    return {
        "connections": [connection_json(node, s) for s in sessions],
        "channels": [channel_json(node, c) for c in channels],
        "consumers": [
            consumer_json(node, consumer)
            for channel in channels
            if channel.session.vhost is not None
            for consumer in list(channel.consumers.values())
        ],
    }


def _visible_sessions(node: Node, user: User) -> list[Session]:
    """Open connections: monitoring and administrators see all, others their own."""
    everything = reads_everything(user)
    return [s for s in list(node.sessions) if s.opened and (everything or s.user == user.name)]


def _session_here(node: Node, name: str, user: User) -> Session | None:
    for session in _visible_sessions(node, user):
        if session.name == name and not session.closing:
            return session
    return None


async def _connection_or_404(node: Node, name: str, user: User) -> dict[str, Any]:
    session = _session_here(node, name, user)  # else another gateway's (cluster)
    found = connection_json(node, session) if session is not None else None
    found = found or await cluster_views.remote_one(node, user, "connections", name)
    if found is None:
        raise HTTPException(404, f"no connection '{name}'")
    return found


def routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    management = Depends(requires(MANAGEMENT, node))
    _connection_routes(router, node, management)
    _channel_routes(router, node, management)
    _consumer_routes(router, node, management)
    return router


def _connection_routes(router: APIRouter, node: Node, management: Any) -> None:
    """Connections: listed, one read, one closed, and one's channels."""

    @router.get("/api/connections", summary="Open connections (a management user: its own)")
    async def connections(request: Request, user: User = management) -> Any:
        rows = [connection_json(node, s) for s in _visible_sessions(node, user)]
        rows += await cluster_views.remote(node, user, "connections")
        return pagination.apply(request, rows, ("name",))

    @router.get("/api/connections/{name}", summary="One connection")
    async def connection(request: Request, name: str, user: User = management) -> Any:
        return pagination.one(request, await _connection_or_404(node, name, user))

    @router.delete(
        "/api/connections/{name}",
        status_code=204,
        summary="Close a connection with 320 CONNECTION_FORCED (reason: the X-Reason header)",
    )
    async def close_connection(
        name: str,
        user: User = management,
        x_reason: Annotated[str | None, Header()] = None,
    ) -> Response:
        # rabbit_mgmt_wm_connection: the reason text is the header's, or this default.
        reason = x_reason or "Closed via management plugin"
        session = _session_here(node, name, user)
        if session is not None:
            session.conn.close(ConnectionForced(reason))
            session.mark_dirty()
        elif not await cluster_views.close_elsewhere(node, user, name, reason):
            raise HTTPException(404, f"no connection '{name}'")
        return Response(status_code=204)

    @router.get("/api/connections/{name}/channels", summary="The channels of one connection")
    async def connection_channels(request: Request, name: str, user: User = management) -> Any:
        session = _session_here(node, name, user)
        if session is not None:
            rows = [channel_json(node, c) for c in list(session.channels.values())]
        else:
            await _connection_or_404(node, name, user)  # another gateway's, or 404
            found = await cluster_views.remote(node, user, "channels")
            rows = [c for c in found if (c.get("connection_details") or {}).get("name") == name]
        return pagination.apply(request, rows, ("name",))


def _channel_routes(router: APIRouter, node: Node, management: Any) -> None:
    @router.get("/api/channels", summary="Open channels (a management user: its own)")
    async def channels(request: Request, user: User = management) -> Any:
        rows = [
            channel_json(node, c)
            for s in _visible_sessions(node, user)
            for c in list(s.channels.values())
        ]
        rows += await cluster_views.remote(node, user, "channels")
        return pagination.apply(request, rows, ("name",))

    @router.get("/api/channels/{name}", summary="One channel ('<connection> (<number>)')")
    async def channel(request: Request, name: str, user: User = management) -> Any:
        for session in _visible_sessions(node, user):
            for state in list(session.channels.values()):
                if f"{session.name} ({state.number})" == name:
                    return pagination.one(request, channel_json(node, state))
        found = await cluster_views.remote_one(node, user, "channels", name)
        if found is None:
            raise HTTPException(404, f"no channel '{name}'")
        return pagination.one(request, found)


def _consumer_routes(router: APIRouter, node: Node, management: Any) -> None:
    @router.get("/api/consumers", summary="Every consumer (of the vhosts the user may see)")
    async def consumers(request: Request, user: User = management) -> Any:
        rows = _consumers(node, user, None) + await cluster_views.remote_consumers(node, user, None)
        return pagination.apply(request, rows, ("consumer_tag",))

    @router.get("/api/consumers/{vhost}", summary="The consumers of one vhost")
    async def vhost_consumers(request: Request, vhost: str, user: User = management) -> Any:
        if vhost not in node.vhosts:
            raise HTTPException(404, f"no vhost '{vhost}'")
        rows = _consumers(node, user, vhost)
        rows += await cluster_views.remote_consumers(node, user, vhost)
        return pagination.apply(request, rows, ("consumer_tag",))
