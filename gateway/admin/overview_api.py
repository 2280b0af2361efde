"""``/api/overview`` and ``/api/nodes`` in RabbitMQ 3.10's shapes, plus mqgw's store figures.

``rabbitmq_version``/``management_version`` say which RabbitMQ API the answers follow (tools
pick features by it); ``product_name``/``product_version`` say what actually runs. A
management user sees the totals of the vhosts it may use and the message rates of their
queues; monitoring and administrators see the node's (``message_stats`` from
gateway/observe/stats.py).
``?msg_rates_age=S&msg_rates_incr=S`` adds the plugin's ``samples``/``avg``/``avg_rate``.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Depends, HTTPException, Request

from gateway.admin import cluster_views, pagination
from gateway.admin.auth import MANAGEMENT, MONITORING, reads_everything, requires
from gateway.admin.paths import SlashRoute
from gateway.admin.queues_api import may_see
from gateway.features.delayed_exchange import EXCHANGE_TYPES
from gateway.observe.stats import queue_counts
from gateway.resources import memory
from meta.models import User

if TYPE_CHECKING:
    from gateway.node import Node
    from gateway.queues.runtime import QueueRuntime

RABBITMQ_API_VERSION = "3.10.8"
PRODUCT_VERSION = "0.1.0"


def _age_params(request: Request) -> tuple[int | None, int | None]:
    try:
        age = request.query_params.get("msg_rates_age")
        incr = request.query_params.get("msg_rates_incr")
        return (int(age) if age else None, int(incr) if incr else None)
    except ValueError:
        raise HTTPException(400, "msg_rates_age and msg_rates_incr must be integers") from None


async def _queue_totals(node: Node, queues: list[QueueRuntime], whole_node: bool) -> dict[str, Any]:
    counts = (await queue_counts(queues)).values()
    ready = sum(c.ready for c in counts)
    unacked = sum(c.unacked for c in counts)
    rates = node.stats.length_rates() if whole_node else (0.0, 0.0, 0.0)
    return {
        "messages": ready + unacked,
        "messages_details": {"rate": rates[0]},
        "messages_ready": ready,
        "messages_ready_details": {"rate": rates[1]},
        "messages_unacknowledged": unacked,
        "messages_unacknowledged_details": {"rate": rates[2]},
    }


def _vhost_message_stats(node: Node, queues: list[QueueRuntime]) -> dict[str, Any]:
    """What a management user's overview shows: the sums over its vhosts' queues."""
    rates = [node.stats.queue_rates(q) for q in queues]
    result: dict[str, Any] = {}
    for index, (key, count) in enumerate(
        (
            ("publish", sum(q.enqueued for q in queues)),
            ("deliver_get", sum(q.delivered for q in queues)),
            ("ack", sum(q.acked for q in queues)),
        )
    ):
        result[key] = count
        result[f"{key}_details"] = {"rate": round(sum(r[index] for r in rates), 1)}
    return result


async def store_json(node: Node) -> dict[str, Any]:
    held = await node.store.held_back_bytes()
    return {
        "disk_bytes": await node.store.disk_bytes(),
        "backlog_bytes": await node.store.backlog_bytes(),
        "held_back_bytes": sum(held.values()),
        "oldest_segment_ts_ms": await node.store.oldest_segment_ts(),
        "appended_records": node.stats.appended_records,
    }


def node_json(node: Node) -> dict[str, Any]:
    settings = node.settings
    disk = shutil.disk_usage(settings.data_dir)
    return {
        "name": node.name,
        "type": "disc",
        "running": True,
        "being_drained": False,
        "os_pid": str(os.getpid()),
        "processors": os.cpu_count() or 1,
        "uptime": time.time_ns() // 1_000_000 - node.stats.started_wall_ms,
        "mem_used": memory.resident_bytes(),
        "mem_limit": node.memory_alarm.on_above,
        "mem_alarm": node.memory_alarm.blocked,
        "disk_free": disk.free,
        "disk_free_limit": settings.min_free_disk_bytes,
        "disk_free_alarm": node.disk_alarm.blocked,
        "sockets_used": len(node.sessions),
        "partitions": [],
        "rates_mode": "basic",
        "exchange_types": [{"name": t, "enabled": True} for t in sorted(EXCHANGE_TYPES)],
    }


def routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    management = Depends(requires(MANAGEMENT, node))
    monitoring = Depends(requires(MONITORING, node))

    @router.get("/api/overview", summary="Totals, message rates and the store (RabbitMQ shape)")
    async def overview(request: Request, user: User = management) -> dict[str, Any]:
        everything = reads_everything(user)
        vhosts = [v for v in node.vhosts.values() if may_see(node, user, v.name)]
        queues = [q for v in vhosts for q in v.queues.values()]
        sessions = [
            s for s in list(node.sessions) if s.opened and (everything or s.user == user.name)
        ]
        exchanges = sum([len(await node.meta.list_exchanges(v.name)) for v in vhosts])
        age, incr = _age_params(request)
        # A cluster: the other gateways' objects and message rates too (cluster_views.py).
        others = await cluster_views.elsewhere(node)
        names = {v.name for v in vhosts}
        remote_consumers = cluster_views.rows(others, "consumers")
        remote_consumers = cluster_views.visible_consumers(node, user, remote_consumers, None)
        return {
            "management_version": RABBITMQ_API_VERSION,
            "rabbitmq_version": RABBITMQ_API_VERSION,
            "product_name": "mqgw",
            "product_version": PRODUCT_VERSION,
            "cluster_name": node.name,
            "node": node.name,
            "rates_mode": "basic",
            "disable_stats": False,
            "statistics_db_event_queue": 0,
            "exchange_types": [{"name": t, "enabled": True} for t in sorted(EXCHANGE_TYPES)],
            "message_stats": cluster_views.add_message_stats(
                node.stats.message_stats(age, incr), others
            )
            if everything
            else _vhost_message_stats(node, queues),
            "queue_totals": await _queue_totals(node, queues, everything),
            "object_totals": {
                "connections": len(sessions)
                + len(cluster_views.owned(user, cluster_views.rows(others, "connections"))),
                "channels": sum(len(s.channels) for s in sessions)
                + len(cluster_views.owned(user, cluster_views.rows(others, "channels"))),
                "consumers": sum(len(q.consumers) for q in queues)
                + sum(1 for c in remote_consumers if c["queue"]["vhost"] in names),
                "exchanges": exchanges,
                "queues": len(queues),
            },
            "mqgw": {
                "store": await store_json(node),
                "alarms": [a.name for a in node.alarms.alarms if a.blocked],
                "ready_queues": node.scheduler.ready_count,
            },
        }

    @router.get("/api/nodes", summary="Every live gateway as RabbitMQ's node list (monitoring)")
    async def nodes(request: Request, _user: User = monitoring) -> Any:
        rows = [await _node_with_store(node)] + await _other_nodes(node)
        return pagination.apply(request, rows, ("name",))

    @router.get("/api/nodes/{name}", summary="One node (monitoring)")
    async def one_node(request: Request, name: str, _user: User = monitoring) -> Any:
        if name == node.name:
            return pagination.one(request, await _node_with_store(node))
        for row in await _other_nodes(node):
            if row.get("name") == name:
                return pagination.one(request, row)
        raise HTTPException(404, f"no node '{name}'")

    return router


async def _node_with_store(node: Node) -> dict[str, Any]:
    return {**node_json(node), "mqgw": {"store": await store_json(node)}}


async def _other_nodes(node: Node) -> list[dict[str, Any]]:
    """The other live gateways of a cluster, as they last published themselves."""
    found = [s.get("node") for s in await cluster_views.elsewhere(node)]
    return [row for row in found if isinstance(row, dict)]
