"""Broker groups of a cluster and the partitions on them (docs/elastic-queues.md):

- ``GET /api/cluster/shares?window_s=1``: each group's share of the traffic (messages
  published during the window plus backlog, per partition at least 1) and how far the
  largest is above even;
- ``POST /api/cluster/rebalance`` with ``{"dry_run": true|false, "window_s": 1,
  "tolerance": 0.1, "per_minute": 60}``: the plan (dry run: 200), or the job started (202);
- ``POST /api/cluster/groups/{group}/drain`` with ``{"per_minute": 60}``: every partition off
  the group (202, the job; 409 with what cannot move and nothing else to do);
- ``GET /api/cluster/moves``: the last job's progress, from any gateway (the job is the
  cluster's: another gateway resumes it when the one running it dies);
- ``DELETE /api/cluster/groups/{group}``: 409 while a partition that is not removed is on it
  (listed), else its removed partitions are re-pointed to groups that hold their queues and
  its brokers are forgotten (204): nothing is placed there again, and its processes can go.

Administrator tag; 400 on the embedded node (no broker groups) or for an unknown group, 409
while another job runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Body, Depends, HTTPException, Response

from gateway.admin.auth import ADMINISTRATOR, requires
from gateway.admin.paths import SlashRoute
from gateway.vhost.group_mover import JobRunning
from gateway.vhost.group_moves import MoveJob, measure
from gateway.vhost.group_plans import plan_drain, plan_rebalance, shares, spread
from meta.models import User

if TYPE_CHECKING:
    from gateway.cluster.placement import QueuePlacement
    from gateway.node import Node
    from gateway.queues.runtime import QueueRuntime


def _number(body: dict[str, Any], key: str, default: float, low: float = 0.0) -> float:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
        raise HTTPException(400, f'"{key}" must be a number of at least {low:g}, not {value!r}')
    return float(value)


class _GroupChecks:
    """The checks every endpoint starts with: the cluster's placement (400 on the embedded
    node), the live groups, and no other move job running (409)."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def placement(self) -> QueuePlacement:
        node = self.node
        placement = node.cluster.placement if node.cluster is not None else None
        if placement is None:
            raise HTTPException(400, "no broker groups on the embedded node")
        return placement

    def live_groups(self) -> list[str]:
        placed = self.placement()
        return [g for g in placed.live() if g in placed.groups]

    async def idle(self) -> None:
        shown = await self.node.group_mover.shown()
        if shown is not None and shown["state"] == "running":
            raise HTTPException(409, RUNNING)

    async def start(self, job: MoveJob) -> None:
        try:
            await self.node.group_mover.start(job)
        except JobRunning:
            raise HTTPException(409, RUNNING) from None


RUNNING = "a move job is running (GET /api/cluster/moves)"


def routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    administrator = Depends(requires(ADMINISTRATOR, node))
    checks = _GroupChecks(node)
    _balance_routes(router, node, checks, administrator)
    _drain_routes(router, node, checks, administrator)
    _retire_route(router, node, checks, administrator)
    return router


def _balance_routes(
    router: APIRouter, node: Node, checks: _GroupChecks, administrator: Any
) -> None:
    """The groups' shares of the traffic, and the rebalance that evens them out."""

    @router.get("/api/cluster/shares", summary="Each broker group's share of the traffic")
    async def group_shares(window_s: float = 1.0, user: User = administrator) -> dict[str, Any]:
        groups = checks.live_groups()
        loads = await measure(node.hosted_queues, min(max(window_s, 0.0), 30.0))
        totals = shares(loads, groups)
        return {
            "groups": totals,
            "spread": round(spread(totals), 3),
            "partitions": {g: sum(1 for x in loads if x.group == g) for g in totals},
        }

    @router.post("/api/cluster/rebalance", summary="Move partitions to even out the groups")
    async def rebalance(
        response: Response, body: Annotated[Any, Body()] = None, user: User = administrator
    ) -> dict[str, Any]:
        body = {} if body is None else body
        if not isinstance(body, dict):
            raise HTTPException(400, "the body must be a JSON object")
        window = min(_number(body, "window_s", 1.0), 30.0)
        tolerance = _number(body, "tolerance", 0.1)
        per_minute = _number(body, "per_minute", 60.0, low=0.1)
        groups = checks.live_groups()
        await checks.idle()
        loads = await measure(node.hosted_queues, window)
        totals = shares(loads, groups)
        moves = plan_rebalance(loads, groups, tolerance)
        if body.get("dry_run"):
            return {"groups": totals, "spread": round(spread(totals), 3),
                    "moves": [m.__dict__ for m in moves]}  # fmt: skip
        job = MoveJob("rebalance", moves, per_minute)
        await checks.start(job)
        response.status_code = 202
        return {"groups": totals, "spread": round(spread(totals), 3), "job": job.view()}


def _drain_routes(router: APIRouter, node: Node, checks: _GroupChecks, administrator: Any) -> None:
    """Draining a group, and the progress of the last move job."""

    @router.post("/api/cluster/groups/{group}/drain", summary="Move every partition off a group")
    async def drain(
        group: str, response: Response, body: Annotated[Any, Body()] = None,
        user: User = administrator,
    ) -> dict[str, Any]:  # fmt: skip
        body = {} if body is None else body
        if not isinstance(body, dict):
            raise HTTPException(400, "the body must be a JSON object")
        per_minute = _number(body, "per_minute", 60.0, low=0.1)
        others = [g for g in checks.live_groups() if g != group]
        if group not in checks.placement().groups:
            raise HTTPException(400, f"no broker group '{group}' in the cluster")
        if not others:
            raise HTTPException(409, f"no other broker group is up to take '{group}''s "
                                "partitions")  # fmt: skip
        await checks.idle()
        loads = await measure(node.hosted_queues, 0.0)
        moves, stuck = plan_drain(loads, group, others)
        if not moves and stuck:
            raise HTTPException(
                409,
                "nothing can move off the group: "
                + "; ".join(sorted({s.fixed or s.queue for s in stuck})),
            )
        job = MoveJob(f"drain {group}", moves, per_minute)
        await checks.start(job)
        response.status_code = 202
        return {"job": job.view(), "cannot_move": [
            {"vhost": s.vhost, "queue": s.queue, "partition": s.partition, "why": s.fixed}
            for s in stuck
        ]}  # fmt: skip

    @router.get("/api/cluster/moves", summary="The last move job's progress")
    async def moves(user: User = administrator) -> dict[str, Any]:
        checks.placement()
        shown = await node.group_mover.shown()
        return {"state": "idle"} if shown is None else shown


def _retire_route(router: APIRouter, node: Node, checks: _GroupChecks, administrator: Any) -> None:
    @router.delete("/api/cluster/groups/{group}", status_code=204, summary="Retire a group")
    async def remove(group: str, user: User = administrator) -> Response:
        placed = checks.placement()
        if group not in placed.groups:
            raise HTTPException(400, f"no broker group '{group}' in the cluster")
        await checks.idle()
        left, repoint = _retirement(node, placed, group)
        if left:
            raise HTTPException(409, f"broker group '{group}' still holds: " + "; ".join(left)
                                + f" (mqgw cluster drain-group {group})")  # fmt: skip
        for queue, moved in repoint:
            await placed.repoint(queue.definition, moved)
        await placed.meta.retire_group(group)
        return Response(status_code=204)


def _retirement(
    node: Node, placed: QueuePlacement, group: str
) -> tuple[list[str], list[tuple[QueueRuntime, dict[int, str]]]]:
    """What keeps ``group`` from retiring (a line per queue), and each queue whose partitions
    on it are all removed, with those partitions re-pointed to another group holding it."""
    left: list[str] = []
    repoint: list[tuple[QueueRuntime, dict[int, str]]] = []
    for host, queue in node.hosted_queues():
        groups = placed(queue.queue_id) or []
        mine = [p for p, g in enumerate(groups) if g == group]
        if not mine:
            continue
        live = [p for p in mine if not queue.is_removed(p)]
        if live:
            left.append(f"{host.name}/{queue.name} partition(s) {live}")
            continue
        owners = [g for g in groups if g != group]
        if not owners:
            left.append(f"{host.name}/{queue.name}: no other group holds it")
            continue
        repoint.append((queue, dict.fromkeys(mine, owners[0])))
    return left, repoint
