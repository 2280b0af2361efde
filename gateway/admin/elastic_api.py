"""Scaling and moving any queue (docs/elastic-queues.md):

- ``POST /api/queues/{vhost}/{name}/scale`` with ``{"partitions": N}``: a plain queue in one
  change (read-first grow, write-first shrink: gateway/vhost/elastic.py), a keyed-order one
  a step at a time (gateway/vhost/rescale.py);
- ``GET /api/queues/{vhost}/{name}/route``: a keyed-order or scaled queue's route (its
  history, each partition's state, group and read position). Management tag.
- ``POST /api/queues/{vhost}/{name}/move`` with ``{"to": GROUP}`` and optionally
  ``"partition": P`` (a keyed-order queue needs it; a plain one moves every partition not on
  GROUP when it is left out).

Both take ``"wait": true`` (answer once the change is complete) and ``"timeout"`` seconds
(default 60): 200 when complete, 202 while in progress, with the route either way. 400 for
a body that says nothing sensible, a count below 1, an unknown or down group; 409 with the
reason when the route refuses (a change in progress, a kind of queue that keeps its
partitions). Policymaker tag.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, cast

from fastapi import APIRouter, Body, Depends, HTTPException, Response

from gateway.admin.auth import MANAGEMENT, POLICYMAKER, requires
from gateway.admin.paths import SlashRoute
from gateway.admin.rescale_api import (
    known_group,
    queue_or_404,
    route_json,
    run_change,
    wait_options,
)
from gateway.queues.ordered import OrderedRuntime
from gateway.queues.runtime import QueueRuntime
from gateway.vhost import elastic
from gateway.vhost.rescale import Step, apply_step
from meta.models import User
from meta.queue_route import QueueRoute

if TYPE_CHECKING:
    from gateway.node import Node
    from gateway.vhost import VirtualHost


def plain_route_json(node: Node, queue: QueueRuntime) -> dict[str, Any]:
    """A scaled plain queue's route: each partition's state, group and read position."""
    route = queue.route
    assert route is not None
    committed = queue.committed_offsets()
    held = [0] * queue.partitions
    for p, _ in queue.held():
        held[p] += 1
    partitions = [
        {
            **part.model_dump(mode="json"),
            "delivered_here": queue.holds_lease(part.partition),
            "held": held[part.partition],
            "unacked": len(queue.inflight[part.partition]),
            "read_to": queue.cursors[part.partition],
            "committed": committed[part.partition],
        }
        for part in route.partitions
    ]
    return {
        "vhost": route.vhost,
        "queue": route.queue,
        "by": route.by,
        "version": route.version,
        "in_progress": route.in_progress(),
        "target_partitions": None,
        "open_partitions": len(route.open_partitions()),
        "versions": [v.model_dump(mode="json") for v in route.versions],
        "partitions": partitions,
    }


def any_route_json(node: Node, host: VirtualHost, queue: QueueRuntime) -> dict[str, Any]:
    if isinstance(queue, OrderedRuntime):
        return route_json(node, queue, host.placement)
    return plain_route_json(node, queue)


def _count(body: Any, key: str) -> int:
    value = body.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise HTTPException(400, f'"{key}" must be an integer, not {value!r}')
    return value


def routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    policymaker = Depends(requires(POLICYMAKER, node))
    management = Depends(requires(MANAGEMENT, node))

    async def change(
        host: VirtualHost, queue: QueueRuntime, body: dict[str, Any], response: Response,
        make: Callable[[], Awaitable[object]],
    ) -> dict[str, Any]:  # fmt: skip
        wait, timeout = wait_options(body)
        complete = await run_change(node, host, queue, make, wait, timeout)
        if not complete:
            response.status_code = 202
        return {"complete": complete, "route": any_route_json(node, host, queue)}

    @router.post("/api/queues/{vhost}/{name}/scale", summary="Grow or shrink a queue")
    async def scale(
        vhost: str, name: str, response: Response, body: Annotated[Any, Body()] = None,
        user: User = policymaker,
    ) -> dict[str, Any]:  # fmt: skip
        host, queue = queue_or_404(node, vhost, name, user)
        if not isinstance(body, dict):
            raise HTTPException(400, 'the body must be a JSON object: {"partitions": N}')
        partitions = _count(body, "partitions")
        if partitions < 1:
            raise HTTPException(400, f'"partitions" must be at least 1, not {partitions}')

        async def make() -> object:
            if isinstance(queue, OrderedRuntime):
                await node.routes.aim(host, queue, partitions)
                return None
            return await elastic.scale(host, queue, partitions)

        return await change(host, queue, body, response, make)

    @router.post("/api/queues/{vhost}/{name}/move", summary="Move a queue's partitions")
    async def move(
        vhost: str, name: str, response: Response, body: Annotated[Any, Body()] = None,
        user: User = policymaker,
    ) -> dict[str, Any]:  # fmt: skip
        host, queue = queue_or_404(node, vhost, name, user)
        if not isinstance(body, dict) or not isinstance(body.get("to"), str):
            raise HTTPException(400, 'the body must name a broker group: {"to": GROUP}')
        group = cast(str, body["to"])
        known_group(host, group)
        partition = None if body.get("partition") is None else _count(body, "partition")
        if isinstance(queue, OrderedRuntime) and partition is None:
            raise HTTPException(400, 'a keyed-order queue moves one partition at a time: '
                                'give "partition"')  # fmt: skip

        async def make() -> QueueRoute:
            if isinstance(queue, OrderedRuntime):
                assert partition is not None
                elastic.check_pin(host, queue, group)
                return await apply_step(host, queue, Step("move", partition, group=group))
            return await elastic.move_partitions(
                host, queue, [] if partition is None else [partition], group
            )

        return await change(host, queue, body, response, make)

    @router.get("/api/queues/{vhost}/{name}/route", summary="A queue's route")
    async def route(vhost: str, name: str, user: User = management) -> dict[str, Any]:
        host, queue = queue_or_404(node, vhost, name, user)
        if queue.route is None:
            raise HTTPException(400, f"queue '{name}' in vhost '{vhost}' is on no route: it is "
                                "not keyed-order and was never scaled")  # fmt: skip
        return any_route_json(node, host, queue)

    return router
