"""Rescaling keyed-order queues (docs/ordering.md) and their route:

- ``POST /api/queues/{vhost}/{name}/rescale`` with exactly one of ``{"split": P, "at": L}``,
  ``{"merge": [P, Q]}``, ``{"move": P, "to": GROUP}``, ``{"partitions": N}``, and optionally
  ``"wait": true`` (answer once every consumer is on the new version) with ``"timeout"``
  seconds (default 60). A single step answers 200 with the new route; ``partitions`` is a
  sequence of steps run by the gateway one after the other (202 at once, 200 with ``wait``
  once reached). 409 with the reason when QMQ's constraints refuse it (a change in
  progress, ranges that are not adjacent, an unknown or closed partition), 400 for a body
  that says none or several, or a queue that is not keyed. Policymaker tag.
- ``GET /api/queues/{vhost}/{name}/route`` (gateway/admin/elastic_api.py): the route's
  history, each physical partition's state, range and broker group, and where each consumer
  is. Management tag.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, cast

import anyio
from fastapi import APIRouter, Body, Depends, HTTPException, Response

from gateway.admin.auth import POLICYMAKER, requires
from gateway.admin.paths import SlashRoute
from gateway.admin.queues_api import visible_vhost
from gateway.queues.ordered import OrderedRuntime
from gateway.queues.runtime import QueueRuntime
from gateway.sessions.channel_state import Consumer
from gateway.vhost import keyed_routes
from gateway.vhost.rescale import Step, apply_step, settled
from meta.errors import RouteConflict
from meta.models import User
from meta.queue_route import RouteRefused, gate_open

if TYPE_CHECKING:
    from gateway.cluster.placement import QueuePlacement
    from gateway.node import Node
    from gateway.vhost import VirtualHost

WAIT_POLL_S = 0.05
CONFLICT_RETRIES = 3  # a route written by another gateway between our read and our write
OPERATIONS = ("split", "merge", "move", "partitions")


def _int(body: dict[str, Any], key: str) -> int:
    value = body.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise HTTPException(400, f'"{key}" must be a non-negative integer, not {value!r}')
    return value


def parse_step(body: Any) -> Step | int:
    """The step a rescale body asks for, or the partition count to reach."""
    if not isinstance(body, dict):
        raise HTTPException(400, "the body must be a JSON object")
    asked = [key for key in OPERATIONS if key in body]
    if len(asked) != 1:
        raise HTTPException(400, 'give exactly one of "split", "merge", "move", "partitions"')
    kind = asked[0]
    if kind == "partitions":
        count = _int(body, "partitions")
        if count < 1:
            raise HTTPException(400, '"partitions" must be at least 1')
        return count
    if kind == "merge":
        pair = body["merge"]
        if isinstance(pair, str):
            pair = [p.strip() for p in pair.split(",")]
        try:
            first, second = (int(p) for p in pair)
        except (TypeError, ValueError):
            raise HTTPException(400, '"merge" must name two partitions: [P, Q] or "P,Q"') from None
        return Step("merge", first, other=second)
    partition = _int(body, kind)
    if kind == "split":
        at = None if body.get("at") is None else _int(body, "at")
        return Step("split", partition, at=at)
    group = body.get("to", "")
    if not isinstance(group, str):
        raise HTTPException(400, '"to" must be a broker group name')
    return Step("move", partition, group=group)


def route_json(
    node: Node, queue: OrderedRuntime, placement: QueuePlacement | None = None
) -> dict[str, Any]:
    """The route with its history, each partition's state and holder, and the consumers."""
    route = queue.route
    committed = queue.committed_offsets()
    ranges = {r.partition: [r.start, r.end] for r in route.ranges}
    placed = placement(queue.queue_id) if placement is not None else None
    partitions = []
    for part in route.partitions:
        p = part.partition
        holder = cast(Consumer | None, queue.holder(p))
        held = len(queue.pending[p]) + len(queue.back[p])
        group = {"group": placed[p]} if placed and p < len(placed) else {}
        partitions.append({
            **part.model_dump(mode="json"),
            **group,
            "range": ranges.get(p),
            "gate": "open" if gate_open(route, p) or part.state == "removed" else "waiting",
            # A cluster: whether this gateway delivers it (holds its lease); holder,
            # consumers and offsets below are this gateway's view.
            "delivered_here": queue.holds_lease(p),
            "consumer": None if holder is None else _consumer(holder),
            "orphaned": p in queue.holders.orphans,
            "held": held,
            "unacked": len(queue.inflight[p]),
            "read_to": queue.cursors[p],
            "committed": committed[p],
        })  # fmt: skip
    consumers = []
    for consumer in cast(list[Consumer], list(queue.consumers)):
        held_parts = [p for p in queue.readable if queue.holder(p) is consumer]
        versions = [route.partitions[p].opened_in for p in held_parts]
        consumers.append({**_consumer(consumer), "partitions": held_parts,
                          "version": max(versions, default=None)})  # fmt: skip
    return {
        "vhost": route.vhost,
        "queue": route.queue,
        "version": route.version,
        "logical_partitions": route.logical,
        "key": "routing key" if route.header is None else f"header {route.header}",
        "in_progress": route.in_progress(),
        "target_partitions": node.routes.target(queue),
        "open_partitions": len(route.ranges),
        "versions": [v.model_dump(mode="json") for v in route.versions],
        "partitions": partitions,
        "consumers": consumers,
    }


def _consumer(consumer: Consumer) -> dict[str, Any]:
    channel = consumer.channel
    return {
        "consumer_tag": consumer.tag,
        "connection": channel.session.name,
        "channel": channel.number,
    }


def known_group(host: VirtualHost, group: str) -> None:
    """A move's target: a broker group of the cluster that is up (400 otherwise)."""
    placement = host.placement
    if placement is None:
        raise HTTPException(400, f"no broker group '{group}' on the embedded node: "
                            "a move goes to a fresh partition (leave \"to\" out)")  # fmt: skip
    up = [g for g in placement.live() if g in placement.groups]
    if group not in up:
        raise HTTPException(400, f"no broker group '{group}' up in the cluster (up: "
                            f"{', '.join(up)})")  # fmt: skip


def wait_options(body: dict[str, Any]) -> tuple[bool, float]:
    """A change's ``"wait"`` and ``"timeout"`` (seconds, default 60)."""
    wait = bool(body.get("wait", False))
    timeout = body.get("timeout", 60)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        raise HTTPException(400, '"timeout" must be a positive number of seconds')
    return wait, float(timeout)


def queue_or_404(node: Node, vhost: str, name: str, user: User) -> tuple[VirtualHost, QueueRuntime]:
    host = visible_vhost(node, vhost, user)
    queue = host.queues.get(name)
    if queue is None:
        raise HTTPException(404, f"no queue '{name}' in vhost '{vhost}'")
    return host, queue


async def run_change(
    node: Node, host: VirtualHost, queue: QueueRuntime, make: Callable[[], Awaitable[object]],
    wait: bool, timeout: float,
) -> bool:  # fmt: skip
    """Make a route change (409 with the reason when refused) and, with ``wait``, wait up
    to ``timeout`` for it to complete; whether it is complete."""
    for attempt in range(CONFLICT_RETRIES + 1):
        try:
            await make()
            node.routes.poke()
            break
        except RouteRefused as refused:
            raise HTTPException(409, str(refused)) from None
        except RouteConflict as conflict:
            # On a cluster another gateway's keeper may have just written the route (a
            # partition removed, a target reached): read it and ask again; a change
            # begun meanwhile is then refused with its reason.
            if attempt == CONFLICT_RETRIES:
                raise HTTPException(409, conflict.detail) from None
            await keyed_routes.follow(host, queue)
    if wait and not settled(queue, node.routes):
        with anyio.move_on_after(timeout):
            while not settled(queue, node.routes) and not queue.deleted:
                await anyio.sleep(WAIT_POLL_S)
    return settled(queue, node.routes)


def routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    policymaker = Depends(requires(POLICYMAKER, node))

    def keyed_queue(vhost: str, name: str, user: User) -> tuple[VirtualHost, OrderedRuntime]:
        host, queue = queue_or_404(node, vhost, name, user)
        if not isinstance(queue, OrderedRuntime):
            raise HTTPException(
                400, f"queue '{name}' in vhost '{vhost}' is not a keyed-order queue "
                "(declare it with x-mqgw-ordering: key)"
            )  # fmt: skip
        return host, queue

    @router.post(
        "/api/queues/{vhost}/{name}/rescale",
        summary="Split, merge or move a keyed-order queue's partitions, or reach a count",
    )
    async def rescale(
        vhost: str, name: str, response: Response, body: Annotated[Any, Body()] = None,
        user: User = policymaker,
    ) -> dict[str, Any]:  # fmt: skip
        host, queue = keyed_queue(vhost, name, user)
        asked = parse_step(body)
        wait, timeout = wait_options(body)
        if isinstance(asked, Step) and asked.kind == "move" and asked.group:
            known_group(host, asked.group)

        async def make() -> None:
            if isinstance(asked, int):
                await node.routes.aim(host, queue, asked)
            else:
                await apply_step(host, queue, asked)

        complete = await run_change(node, host, queue, make, wait, timeout)
        if not complete and (isinstance(asked, int) or wait):
            response.status_code = 202
        return {"complete": complete, "route": route_json(node, queue, host.placement)}

    return router
