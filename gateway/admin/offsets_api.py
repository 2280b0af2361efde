"""Offset reset by time (RocketMQ's resetOffsetByTime) for any queue:
``POST /api/queues/{vhost}/{name}/reset`` with ``{"timestamp": <ms since the epoch>}`` or
``{"to": "<ISO-8601, or ms>"}`` (an ISO time without a zone is UTC).

Each partition of the queue is then read from its first message stored at or after that
time. The answer says how many messages the move skips (the position went forward) or
replays (it went back, over messages already consumed that the log still holds), in total and
per partition. Policymaker tag, as for the other operator actions on queues.

Refused with 400 for stream queues (each consumer picks its own start with x-stream-offset),
broadcast queues (each consumer has its own position) and priority queues (their per-level
positions are not one offset); with 409 when another gateway of the cluster delivers it.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Body, Depends, HTTPException

from gateway.admin.auth import POLICYMAKER, reads_everything, requires
from gateway.admin.paths import SlashRoute
from gateway.features.broadcast import is_broadcast
from gateway.features.stream import is_stream
from gateway.queues.priority import PriorityQueueRuntime
from meta.models import User

if TYPE_CHECKING:
    from gateway.node import Node
    from gateway.queues.runtime import QueueRuntime


def reset_time_ms(body: Any) -> int:
    """The time a reset body names, in ms since the epoch; ValueError says what is wrong."""
    if not isinstance(body, dict) or ("timestamp" in body) == ("to" in body):
        raise ValueError('give exactly one of "timestamp" (ms since the epoch) or "to"')
    value = body.get("timestamp", body.get("to"))
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if "to" in body and isinstance(value, str):
        if value.strip().lstrip("-").isdigit():
            return int(value)
        try:
            moment = dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"'{value}' is neither ISO-8601 nor ms since the epoch") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
        return int(moment.timestamp() * 1000)
    raise ValueError("the time must be an integer of ms since the epoch or an ISO-8601 string")


def _refusal(queue: QueueRuntime) -> str | None:
    if is_stream(queue):
        return "stream queues have no queue position: consumers choose with x-stream-offset"
    if is_broadcast(queue.definition):
        return "broadcast queues have one position per consumer, not one for the queue"
    if isinstance(queue, PriorityQueueRuntime):
        return "priority queues keep a position per priority level, not one offset"
    return None


def routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    policymaker = Depends(requires(POLICYMAKER, node))

    @router.post(
        "/api/queues/{vhost}/{name}/reset",
        summary="Move the queue's position to the first message stored at or after a time",
    )
    async def reset_queue(
        vhost: str, name: str, body: Annotated[Any, Body()] = None, user: User = policymaker
    ) -> dict[str, Any]:
        host = node.vhosts.get(vhost)
        visible = reads_everything(user) or node.access.may_use_vhost(user.name, vhost)
        if host is None or not visible:
            raise HTTPException(404, f"no vhost '{vhost}'")
        queue = host.queues.get(name)
        if queue is None:
            raise HTTPException(404, f"no queue '{name}' in vhost '{vhost}'")
        try:
            ts_ms = reset_time_ms(body)
        except ValueError as error:
            raise HTTPException(400, str(error)) from None
        refusal = _refusal(queue)
        if refusal is not None:
            raise HTTPException(400, f"queue '{name}' cannot be reset: {refusal}")
        if not queue.holds_all_leases():
            raise HTTPException(409, f"queue '{name}' is delivered by another gateway")
        moves = await queue.reset_to_time(ts_ms)
        node.scheduler.wake(queue)
        partitions = [
            {
                "partition": p,
                "from_offset": old,
                "to_offset": new,
                "skipped": max(0, new - old),
                "replayed": max(0, old - new),
            }
            for p, (old, new) in enumerate(moves)
        ]
        return {
            "vhost": vhost,
            "queue": name,
            "timestamp": ts_ms,
            "skipped": sum(p["skipped"] for p in partitions),
            "replayed": sum(p["replayed"] for p in partitions),
            "messages_ready": queue.ready_count,
            "partitions": partitions,
        }

    return router
