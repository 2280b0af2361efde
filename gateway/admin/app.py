"""The admin HTTP API: health, queues (RabbitMQ management shapes plus mqgw's counters) and
policies (RabbitMQ's PUT/DELETE /api/policies/{vhost}/{name})."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Body, FastAPI, HTTPException, Response

from gateway.redelivery import redrive
from meta.models import Policy

if TYPE_CHECKING:
    from gateway.node import Node
    from gateway.queue_runtime import QueueRuntime
    from gateway.vhost import VirtualHost


def queue_stats(queue: QueueRuntime) -> dict[str, Any]:
    unacked = queue.enqueued - queue.ready_count - queue.acked - queue.dead_lettered
    unacked -= queue.dropped + queue.retried
    behaviour = queue.behaviour
    return {
        "name": queue.name,
        "vhost": queue.definition.vhost,
        "durable": queue.definition.durable,
        "auto_delete": queue.definition.auto_delete,
        "exclusive": queue.definition.exclusive,
        "arguments": queue.definition.arguments,
        "consumers": len(queue.consumers),
        "messages_ready": queue.ready_count,
        "messages_unacknowledged": unacked,
        "messages": queue.ready_count + unacked,
        "message_bytes_ready": queue.ready_bytes,
        "state": "running",
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
            "paused": queue.paused,
            "overflow": behaviour.overflow,
            "redelivery": behaviour.redelivery,
        },
    }


def create_app(node: Node) -> FastAPI:
    app = FastAPI(title="mqgw admin", version="0.1.0")

    def vhost_or_404(name: str) -> VirtualHost:
        vhost = node.vhosts.get(name)
        if vhost is None:
            raise HTTPException(404, f"no vhost '{name}'")
        return vhost

    @app.get("/api/health", summary="Liveness: the node is up and serving AMQP")
    async def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "connections": node.open_connections,
            "vhosts": sorted(node.vhosts),
            "queues": sum(len(v.queues) for v in node.vhosts.values()),
        }

    @app.get("/api/queues", summary="Every queue with its counts")
    async def queues() -> list[dict[str, Any]]:
        return [queue_stats(q) for v in node.vhosts.values() for q in v.queues.values()]

    @app.get("/api/queues/{vhost:path}/{name}", summary="One queue's counts")
    async def queue(vhost: str, name: str) -> dict[str, Any]:
        runtime = vhost_or_404(vhost).queues.get(name)
        if runtime is None:
            raise HTTPException(404, f"no queue '{name}' in vhost '{vhost}'")
        return queue_stats(runtime)

    @app.post(
        "/api/queues/{vhost:path}/{name}/redrive",
        summary="Move messages from <name>.dlq back to <name> (mqgw queue redrive)",
    )
    async def redrive_queue(vhost: str, name: str, limit: int = 10_000) -> dict[str, int]:
        try:
            moved, remaining = await redrive(vhost_or_404(vhost), name, limit)
        except KeyError as missing:
            raise HTTPException(404, f"no queue {missing} in vhost '{vhost}'") from None
        return {"moved": moved, "remaining": remaining}

    @app.get("/api/timer", summary="The log timer: delayed messages and backoff retries")
    async def timer() -> dict[str, Any]:
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

    @app.get("/api/policies", summary="Every policy")
    async def policies() -> list[dict[str, Any]]:
        return [p.model_dump(by_alias=True) for p in await node.meta.list_policies()]

    @app.put("/api/policies/{vhost:path}/{name}", status_code=201, summary="Set a policy")
    async def put_policy(
        vhost: str, name: str, body: Annotated[dict[str, Any], Body()]
    ) -> Response:
        host = vhost_or_404(vhost)
        try:
            policy = Policy.model_validate({**body, "vhost": vhost, "name": name})
        except ValueError as error:
            raise HTTPException(400, str(error)) from None
        await node.meta.put_policy(policy)
        await host.apply_policies()
        return Response(status_code=201)

    @app.delete("/api/policies/{vhost:path}/{name}", status_code=204, summary="Clear a policy")
    async def delete_policy(vhost: str, name: str) -> Response:
        host = vhost_or_404(vhost)
        if not await node.meta.delete_policy(vhost, name):
            raise HTTPException(404, f"no policy '{name}' in vhost '{vhost}'")
        await host.apply_policies()
        return Response(status_code=204)

    return app
