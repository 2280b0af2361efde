"""Queues (RabbitMQ management shapes plus mqgw's counters), the log timer, and policies
(RabbitMQ's PUT/DELETE /api/policies/{vhost}/{name})."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Body, Depends, HTTPException, Response

from gateway.admin.auth import MANAGEMENT, MONITORING, POLICYMAKER, reads_everything, requires
from gateway.admin.connections_api import consumer_json
from gateway.admin.paths import SlashRoute
from gateway.redelivery import redrive
from meta.models import Policy, User

if TYPE_CHECKING:
    from gateway.node import Node
    from gateway.queue_runtime import QueueRuntime
    from gateway.vhost import VirtualHost


def queue_stats(node: Node, queue: QueueRuntime, held: dict[int, int]) -> dict[str, Any]:
    active = queue.active_consumer
    exclusive = next((c.tag for c in queue.consumers if c.exclusive), None)
    unacked = queue.enqueued - queue.ready_count - queue.acked - queue.dead_lettered
    unacked -= queue.dropped + queue.retried + queue.dropped_by_retention
    behaviour = queue.behaviour
    control = node.controls.effective_for_queue(queue.definition.vhost, queue.name)
    return {
        "name": queue.name,
        "vhost": queue.definition.vhost,
        "durable": queue.definition.durable,
        "auto_delete": queue.definition.auto_delete,
        "exclusive": queue.definition.exclusive,
        "arguments": queue.definition.arguments,
        "consumers": len(queue.consumers),
        "exclusive_consumer_tag": exclusive,
        "single_active_consumer_tag": None if active is None else active.tag,
        "messages_ready": queue.ready_count,
        "messages_unacknowledged": unacked,
        "messages": queue.ready_count + unacked,
        "message_bytes_ready": queue.ready_bytes,
        "state": "stopped" if control["state"] == "stopped" else "running",
        "mqgw": {
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
        },
    }


def may_see(node: Node, user: User, vhost: str) -> bool:
    """monitoring/administrator see every vhost, management users those they may use."""
    return reads_everything(user) or node.access.may_use_vhost(user.name, vhost)


def routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    management = Depends(requires(MANAGEMENT, node))
    monitoring = Depends(requires(MONITORING, node))
    policymaker = Depends(requires(POLICYMAKER, node))

    def vhost_or_404(name: str, user: User) -> VirtualHost:
        vhost = node.vhosts.get(name)
        if vhost is None or not may_see(node, user, name):
            raise HTTPException(404, f"no vhost '{name}'")
        return vhost

    @router.get("/api/queues", summary="Every queue with its counts and effective control")
    async def queues(user: User = management) -> list[dict[str, Any]]:
        held = await node.store.held_back_bytes()
        return [
            queue_stats(node, q, held)
            for v in node.vhosts.values()
            if may_see(node, user, v.name)
            for q in v.queues.values()
        ]

    @router.get("/api/queues/{vhost}", summary="The queues of one vhost")
    async def vhost_queues(vhost: str, user: User = management) -> list[dict[str, Any]]:
        host = vhost_or_404(vhost, user)
        held = await node.store.held_back_bytes()
        return [queue_stats(node, q, held) for q in host.queues.values()]

    @router.get("/api/queues/{vhost}/{name}", summary="One queue's counts")
    async def queue(vhost: str, name: str, user: User = management) -> dict[str, Any]:
        runtime = vhost_or_404(vhost, user).queues.get(name)
        if runtime is None:
            raise HTTPException(404, f"no queue '{name}' in vhost '{vhost}'")
        stats = queue_stats(node, runtime, await node.store.held_back_bytes())
        # As RabbitMQ's management plugin: the consumers only in the one-queue view.
        stats["consumer_details"] = [consumer_json(node, c) for c in list(runtime.consumers)]
        return stats

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

    @router.get("/api/policies", summary="Every policy (of the vhosts the user may see)")
    async def policies(user: User = management) -> list[dict[str, Any]]:
        return [
            p.model_dump(by_alias=True)
            for p in await node.meta.list_policies()
            if may_see(node, user, p.vhost)
        ]

    @router.put("/api/policies/{vhost}/{name}", status_code=201, summary="Set a policy")
    async def put_policy(
        vhost: str, name: str, body: Annotated[dict[str, Any], Body()], user: User = policymaker
    ) -> Response:
        host = vhost_or_404(vhost, user)
        try:
            policy = Policy.model_validate({**body, "vhost": vhost, "name": name})
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

    return router
