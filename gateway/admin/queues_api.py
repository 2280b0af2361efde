"""Queues (RabbitMQ management shapes plus mqgw's counters), the log timer, and policies
(RabbitMQ's PUT/DELETE /api/policies/{vhost}/{name})."""

from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any, cast

from fastapi import APIRouter, Body, Depends, HTTPException, Request, Response

from gateway.admin import pagination
from gateway.admin.auth import MANAGEMENT, MONITORING, POLICYMAKER, reads_everything, requires
from gateway.admin.connections_api import consumer_json, json_value
from gateway.admin.paths import SlashRoute
from gateway.features.redelivery import redrive
from gateway.observe.stats import QueueCounts, queue_counts, queue_message_stats
from gateway.queues.consumer import LANE_GRAY, LANE_NORMAL
from gateway.queues.ordered import OrderedRuntime
from gateway.sessions.channel_state import Consumer
from meta.models import Policy, User

if TYPE_CHECKING:
    from gateway.node import Node
    from gateway.queues.runtime import QueueRuntime
    from gateway.vhost import VirtualHost


def head_age_s(queue: QueueRuntime, now_ms: int) -> float | None:
    """Seconds since the oldest ready message read into memory was stored (None: none is)."""
    oldest = min((m.store_ts_ms for _, m in queue.held()), default=None)  # both gray lanes
    return None if oldest is None else round(max(0, now_ms - oldest) / 1000, 3)


def queue_stats(
    node: Node, queue: QueueRuntime, held: dict[int, int], counts: dict[int, QueueCounts]
) -> dict[str, Any]:
    active = queue.active_consumer
    exclusive = next((c.tag for c in queue.consumers if c.exclusive), None)
    ready, unacked = counts[queue.queue_id]
    behaviour = queue.behaviour
    definition = queue.definition
    control = node.controls.effective_for_queue(definition.vhost, queue.name)
    vhost = node.vhosts.get(definition.vhost)
    policy = None if vhost is None else vhost.policy_for(queue.name)
    messages, ready_rate, unacked_rate = node.stats.queue_length_rates(queue)
    return {
        "name": queue.name,
        "vhost": definition.vhost,
        "node": node.name,
        "type": str(definition.arguments.get("x-queue-type", "classic")),
        "durable": definition.durable,
        "auto_delete": definition.auto_delete,
        "exclusive": definition.exclusive,
        "arguments": json_value(definition.arguments),
        "policy": None if policy is None else policy.name,
        "partitions": queue.partitions,
        "gray_partitions": len(queue.gray_parts),  # in force: a policy K too large is none
        "consumers": len(queue.consumers),
        "exclusive_consumer_tag": exclusive,
        "single_active_consumer_tag": None if active is None else active.tag,
        "messages_ready": ready,
        "messages_ready_details": {"rate": ready_rate},
        "messages_unacknowledged": unacked,
        "messages_unacknowledged_details": {"rate": unacked_rate},
        "messages": ready + unacked,
        "messages_details": {"rate": messages},
        "message_bytes_ready": queue.ready_bytes,
        "message_stats": queue_message_stats(node.stats, queue),
        "state": "stopped" if control["state"] == "stopped" else "running",
        "mqgw": {
            "partitions": queue.partitions,
            "committed_offsets": queue.committed_offsets(),
            "consumer_lag_messages": ready + unacked,
            "consumer_lag_seconds": head_age_s(queue, time.time_ns() // 1_000_000),
            "published": queue.enqueued,
            "delivered": queue.delivered,
            "acked": queue.acked,
            "dead_lettered": queue.dead_lettered,
            "dropped": queue.dropped,
            "rejected_publishes": queue.rejected_publishes,
            "retried": queue.retried,
            "waiting_for_backoff": queue.held_for_retry,
            "dropped_by_retention": queue.dropped_by_retention,
            # Commitlog bytes from the segment of its oldest unconsumed record to the end:
            # what this queue keeps from being reclaimed.
            "commitlog_bytes_held": held.get(queue.queue_id, 0),
            "paused": queue.paused,
            "control": control,
            "overflow": behaviour.overflow,
            "redelivery": behaviour.redelivery,
            "max_age_ms": behaviour.max_age_ms,
            "disk_overflow": behaviour.disk_overflow,
            "ordering": ordering_summary(queue),
            "breaker": None
            if queue.breaker is None
            else queue.breaker.view(queue.clock.monotonic()),
            "autoscale": node.autoscaler.view(queue),
        },
    }


def ordering_summary(queue: QueueRuntime) -> dict[str, Any] | None:
    """A keyed-order queue's route in brief (the whole of it: GET .../route); None for others."""
    if not isinstance(queue, OrderedRuntime):
        return None
    route = queue.route
    return {"version": route.version, "open_partitions": len(route.ranges),
            "in_progress": route.in_progress()}  # fmt: skip


async def partition_details(node: Node, queue: QueueRuntime) -> list[dict[str, Any]]:
    """Per partition, from the store: offsets, the queue's committed position, how far its
    consumers are behind (messages, and seconds since the oldest unconsumed was stored)."""
    stats = await node.store.queue_stats(queue.queue_id)
    committed = queue.committed_offsets()
    now_ms = time.time_ns() // 1_000_000
    details = []
    gray = set(queue.gray_parts)
    readers = {  # consumers reading each lane (gateway/queues/gray_lanes.py)
        True: sum(1 for c in queue.consumers if c.lane != LANE_NORMAL),
        False: sum(1 for c in queue.consumers if c.lane != LANE_GRAY or not gray),
    }
    for part in stats.partitions:
        position = max(committed[part.partition], part.min_offset)
        lag_s = None
        if position < part.max_offset:
            head = await node.store.read(queue.queue_id, part.partition, position, max_count=1)
            if head.messages:
                lag_s = round(max(0, now_ms - head.messages[0].store_ts_ms) / 1000, 3)
        details.append(
            {
                "partition": part.partition,
                "min_offset": part.min_offset,
                "max_offset": part.max_offset,
                "committed_offset": committed[part.partition],
                "stored_committed_offset": part.committed,
                "lag_messages": max(0, part.max_offset - position),
                "lag_seconds": 0.0 if position >= part.max_offset else lag_s,
                "dropped_by_retention": part.dropped_by_retention,
                "gray": part.partition in gray,
                "depth": max(0, part.max_offset - position),  # ready and unacked
                "consumers": readers[part.partition in gray],
            }
        )
    return details


def may_see(node: Node, user: User, vhost: str) -> bool:
    """monitoring/administrator see every vhost, management users those they may use."""
    return reads_everything(user) or node.access.may_use_vhost(user.name, vhost)


def visible_vhost(node: Node, name: str, user: User) -> VirtualHost:
    """The open vhost ``name`` if ``user`` may see it, else 404 (as RabbitMQ: not 403)."""
    vhost = node.vhosts.get(name)
    if vhost is None or not may_see(node, user, name):
        raise HTTPException(404, f"no vhost '{name}'")
    return vhost


def permit(node: Node, user: User, vhost: str, kind: str, name: str) -> None:
    """The user's write (publish) or read (get) permission on ``name``, else RabbitMQ's 401."""
    if not node.access.grants(user.name, vhost).check("write" if kind == "write" else "read", name):
        raise HTTPException(401, "Access refused.")


def routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    management = Depends(requires(MANAGEMENT, node))
    monitoring = Depends(requires(MONITORING, node))
    policymaker = Depends(requires(POLICYMAKER, node))

    _queue_routes(router, node, management, policymaker)
    _timer_route(router, node, monitoring)
    _policy_routes(router, node, management, policymaker)
    return router


def _queue_routes(router: APIRouter, node: Node, management: Any, policymaker: Any) -> None:
    """The queue lists, one queue in detail, and the redrive from its dead-letter queue."""
    vhost_or_404 = partial(visible_vhost, node)

    @router.get("/api/queues", summary="Every queue with its counts and effective control")
    async def queues(request: Request, user: User = management) -> Any:
        held = await node.store.held_back_bytes()
        shown = [
            q
            for v in node.vhosts.values()
            if may_see(node, user, v.name)
            for q in v.queues.values()
        ]
        counts = await queue_counts(shown)
        rows = [queue_stats(node, q, held, counts) for q in shown]
        return pagination.apply(request, rows)

    @router.get("/api/queues/{vhost}", summary="The queues of one vhost")
    async def vhost_queues(request: Request, vhost: str, user: User = management) -> Any:
        host = vhost_or_404(vhost, user)
        held = await node.store.held_back_bytes()
        shown = list(host.queues.values())
        counts = await queue_counts(shown)
        rows = [queue_stats(node, q, held, counts) for q in shown]
        return pagination.apply(request, rows)

    @router.get("/api/queues/{vhost}/{name}", summary="One queue's counts, partitions and lag")
    async def queue(request: Request, vhost: str, name: str, user: User = management) -> Any:
        runtime = vhost_or_404(vhost, user).queues.get(name)
        if runtime is None:
            raise HTTPException(404, f"no queue '{name}' in vhost '{vhost}'")
        held = await node.store.held_back_bytes()
        stats = queue_stats(node, runtime, held, await queue_counts([runtime]))
        # As RabbitMQ's management plugin: the consumers only in the one-queue view.
        stats["consumer_details"] = [
            consumer_json(node, c) for c in cast(list[Consumer], list(runtime.consumers))
        ]
        stats["mqgw"]["partition_details"] = await partition_details(node, runtime)
        return pagination.one(request, stats)

    @router.post(
        "/api/queues/{vhost}/{name}/redrive",
        summary="Move messages from <name>.dlq back to <name> (mqgw queue redrive)",
    )
    async def redrive_queue(
        vhost: str, name: str, limit: int = 10_000, user: User = policymaker
    ) -> dict[str, int]:
        try:
            moved, remaining = await redrive(vhost_or_404(vhost, user), name, limit)
        except KeyError as missing:
            raise HTTPException(404, f"no queue {missing} in vhost '{vhost}'") from None
        return {"moved": moved, "remaining": remaining}


def _timer_route(router: APIRouter, node: Node, monitoring: Any) -> None:
    @router.get("/api/timer", summary="The log timer: delayed messages and backoff retries")
    async def timer(_user: User = monitoring) -> dict[str, Any]:
        t = node.timer
        pending = await t.pending_per_level()
        return {
            "levels_ms": list(t.levels_ms),
            "pending_per_level": pending,
            "pending": sum(pending),
            "in_memory": t.in_memory,
            "fired": t.fired,
            "hops": t.hops,
            "dropped": t.dropped,
            "redelivery": {
                "scheduled": node.redelivery.scheduled,
                "returned": node.redelivery.returned,
                "dropped": node.redelivery.dropped,
            },
        }


def _policy_routes(router: APIRouter, node: Node, management: Any, policymaker: Any) -> None:
    """RabbitMQ's policies: listed, read, set and cleared per vhost."""
    vhost_or_404 = partial(visible_vhost, node)

    @router.get("/api/policies", summary="Every policy (of the vhosts the user may see)")
    async def policies(user: User = management) -> list[dict[str, Any]]:
        return [
            p.model_dump(by_alias=True)
            for p in await node.meta.list_policies()
            if may_see(node, user, p.vhost)
        ]

    @router.get("/api/policies/{vhost}", summary="The policies of a vhost")
    async def vhost_policies(vhost: str, user: User = management) -> list[dict[str, Any]]:
        vhost_or_404(vhost, user)
        return [p.model_dump(by_alias=True) for p in await node.meta.list_policies(vhost)]

    @router.get("/api/policies/{vhost}/{name}", summary="One policy")
    async def policy(vhost: str, name: str, user: User = management) -> dict[str, Any]:
        vhost_or_404(vhost, user)
        for p in await node.meta.list_policies(vhost):
            if p.name == name:
                return p.model_dump(by_alias=True)
        raise HTTPException(404, f"no policy '{name}' in vhost '{vhost}'")

    @router.put("/api/policies/{vhost}/{name}", status_code=201, summary="Set a policy")
    async def put_policy(
        vhost: str, name: str, body: Annotated[dict[str, Any], Body()], user: User = policymaker
    ) -> Response:
        host = vhost_or_404(vhost, user)
        try:
            policy = Policy.model_validate({**body, "vhost": vhost, "name": name})
            host.check_policy(policy)  # mqgw's partition keys (meta/partitions.py)
        except ValueError as error:
            raise HTTPException(400, str(error)) from None
        await node.meta.put_policy(policy)
        await host.apply_policies()
        return Response(status_code=201)

    @router.delete("/api/policies/{vhost}/{name}", status_code=204, summary="Clear a policy")
    async def delete_policy(vhost: str, name: str, user: User = policymaker) -> Response:
        host = vhost_or_404(vhost, user)
        if not await node.meta.delete_policy(vhost, name):
            raise HTTPException(404, f"no policy '{name}' in vhost '{vhost}'")
        await host.apply_policies()
        return Response(status_code=204)
