"""The other gateways' objects in this gateway's management views (cluster mode).

A gateway answers /api/connections, /api/channels, /api/consumers, /api/overview and
/api/nodes for the whole cluster, as any RabbitMQ node does: its own objects as they are,
the other live gateways' as they last published them (gateway/cluster/views.py: at most a
second old; a dead gateway's gone within 3 s). Each row names its gateway in ``node``.
``attach`` hands the cluster link what this gateway publishes. Embedded: nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException

from gateway.admin.auth import reads_everything
from gateway.amqp.errors import ConnectionForced
from gateway.cluster.views import CLOSED, ClusterViews
from meta.errors import MetadataUnavailable
from meta.models import User

if TYPE_CHECKING:
    from gateway.node import Node

Rows = list[dict[str, Any]]


class _Source:
    """gateway.cluster.views.ViewSource over this node's admin rows."""

    def __init__(self, node: Node, build: Callable[[], dict[str, Any]]) -> None:
        self.node = node
        self.build = build

    def snapshot(self) -> dict[str, Any]:
        return self.build()

    def close_connection(self, name: str, reason: str) -> bool:
        return close_here(self.node, name, reason)


def _views(node: Node) -> ClusterViews | None:
    return node.cluster.views if node.cluster is not None else None


def attach(node: Node, build: Callable[[], dict[str, Any]]) -> None:
    """In cluster mode, publish what ``build`` makes of this gateway (see ViewSource)."""
    views = _views(node)
    if views is not None:
        views.source = _Source(node, build)


def close_here(node: Node, name: str, reason: str) -> bool:
    """Close connection ``name`` of this gateway with 320 CONNECTION_FORCED and ``reason``
    (rabbit_mgmt_wm_connection's); False if this gateway does not hold it (open)."""
    for session in list(node.sessions):
        if session.name == name and session.opened and not session.closing:
            session.conn.close(ConnectionForced(reason))
            session.mark_dirty()
            return True
    return False


async def elsewhere(node: Node) -> list[dict[str, Any]]:
    """The other live gateways' views (embedded: none), ordered by gateway name."""
    views = _views(node)
    if views is None:
        return []
    others = await views.others()
    return [others[gateway] for gateway in sorted(others)]


def rows(snapshots: Iterable[dict[str, Any]], kind: str) -> Rows:
    return [
        row for snapshot in snapshots for row in (snapshot.get(kind) or []) if isinstance(row, dict)
    ]


def owned(user: User, found: Rows) -> Rows:
    """Connections and channels: monitoring and administrators see all, others their own."""
    everything = reads_everything(user)
    return [row for row in found if everything or row.get("user") == user.name]


async def remote(node: Node, user: User, kind: str) -> Rows:
    """The other gateways' connections or channels that ``user`` may see."""
    return owned(user, rows(await elsewhere(node), kind))


async def remote_consumers(node: Node, user: User, vhost: str | None) -> Rows:
    """The other gateways' consumers in the vhosts ``user`` may see (``vhost``: that one)."""
    return visible_consumers(node, user, rows(await elsewhere(node), "consumers"), vhost)


def visible_consumers(node: Node, user: User, found: Rows, vhost: str | None) -> Rows:
    """Consumers (rows) in the vhosts ``user`` may see (monitoring, administrators: all)."""
    everything = reads_everything(user)
    visible = []
    for row in found:
        queue = row.get("queue")
        where = queue.get("vhost") if isinstance(queue, dict) else None
        if not isinstance(where, str) or (vhost is not None and where != vhost):
            continue
        if everything or node.access.may_use_vhost(user.name, where):
            visible.append(row)
    return visible


async def remote_one(node: Node, user: User, kind: str, name: str) -> dict[str, Any] | None:
    """Another gateway's connection or channel ``name``, if ``user`` may see it."""
    for row in await remote(node, user, kind):
        if row.get("name") == name:
            return row
    return None


async def close_elsewhere(node: Node, user: User, name: str, reason: str) -> bool:
    """Close connection ``name`` where it is held (another gateway); False if no gateway
    holds it (for ``user``'s eyes). 503 when its gateway does not answer in time."""
    views = _views(node)
    if views is None:
        return False
    row = await remote_one(node, user, "connections", name)
    gateway = row.get("node") if row is not None else None
    if not isinstance(gateway, str):
        return False
    try:
        answer = await views.ask_close(gateway, name, reason)
    except MetadataUnavailable as error:
        raise HTTPException(503, f"connection '{name}' is on gateway {gateway}: {error}") from None
    if answer is None:
        raise HTTPException(503, f"gateway {gateway} holding '{name}' did not answer")
    return answer == CLOSED


def add_message_stats(local: dict[str, Any], others: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """``message_stats`` summed over the gateways: counts and their ``rate``s. The samples
    (``msg_rates_age``) stay this gateway's own: the others publish no history."""
    total = {k: (dict(v) if isinstance(v, dict) else v) for k, v in local.items()}
    for snapshot in others:
        stats = snapshot.get("message_stats")
        if not isinstance(stats, dict):
            continue
        for key, value in stats.items():
            mine = total.get(key)
            if isinstance(value, int | float) and isinstance(mine, int | float):
                total[key] = mine + value
            elif isinstance(value, dict) and isinstance(mine, dict):
                rate = value.get("rate")
                if isinstance(rate, int | float) and isinstance(mine.get("rate"), int | float):
                    mine["rate"] = round(mine["rate"] + rate, 1)
    return total
