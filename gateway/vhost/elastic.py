"""Scaling and moving plain queues (docs/elastic-queues.md; the route's rules are
meta/channel_route.py's).

- **grow** (read-first): the store queue gains the partitions (placed first on a cluster,
  on the live broker groups holding the fewest of the queue's open partitions), version v+1
  is written with them ``opening``; every gateway's runtime reads them from then on, and
  they open once read: at once on the embedded node, on a cluster when the gateway that
  delivers the queue holds their leases (``open_when_read``; by anyone after
  ``OPEN_GRACE_S``: no gateway delivers the queue, nobody would read them sooner);
- **shrink** and **move** (write-first): v+1 closes partitions (a move: when its new
  partition opens); publishers leave them at once, their command records are appended, they
  drain and are removed by the route keeper (gateway/vhost/rescale.py), as keyed ones are.

A plain queue gets its route (version 1: as declared) when it is first scaled.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

from gateway.features.queue_kinds import scale_refusal
from gateway.queues.runtime import QueueRuntime
from gateway.vhost import keyed_routes
from gateway.vhost.host import VirtualHost
from meta.channel_route import channel_route, grow, move, opened, shrink
from meta.cluster import spread_partitions
from meta.errors import RouteConflict
from meta.queue_route import QueueRoute, RouteRefused

log = logging.getLogger("mqgw.rescale")
OPEN_GRACE_S = 5.0


def _when(host: VirtualHost) -> str:
    return keyed_routes.iso_now(host.scheduler.clock.wall_ms())


async def ensure_route(host: VirtualHost, queue: QueueRuntime) -> QueueRoute:
    """The queue's route; a plain queue's first (as declared) is written now."""
    if queue.route is not None:
        return queue.route
    refusal = scale_refusal(queue)
    if refusal is not None:
        raise RouteRefused(refusal)
    placed = host.placement(queue.queue_id) if host.placement is not None else None
    route = channel_route(host.name, queue.name, queue.queue_id, queue.partitions,
                          placed or (), _when(host))  # fmt: skip
    try:
        await host.meta.set_route(route, None)
    except RouteConflict:  # scaled on another gateway meanwhile: its route
        await keyed_routes.follow(host, queue)
        assert queue.route is not None
        return queue.route
    host.routed[queue.queue_id] = queue
    queue.set_route(route)
    return route


async def scale(host: VirtualHost, queue: QueueRuntime, partitions: int) -> QueueRoute:
    """One change to ``partitions`` open partitions (RouteRefused with the reason)."""
    route = await ensure_route(host, queue)
    have = len(route.open_partitions())
    if partitions == have:
        return route
    if partitions > have:
        groups = _groups_for(host, queue, route, partitions - have)
        new = grow(route, partitions - have, groups, _when(host))
    else:
        new = shrink(route, partitions, _when(host))
    return await apply(host, queue, route, new)


async def move_partitions(
    host: VirtualHost, queue: QueueRuntime, partitions: Sequence[int], group: str
) -> QueueRoute:
    """``partitions`` (every open one not on ``group`` if none are named) to new ones on
    ``group``; each old one closes when its new one opens."""
    check_pin(host, queue, group)
    route = await ensure_route(host, queue)
    if not partitions:
        partitions = [p for p in route.open_partitions() if route.partitions[p].group != group]
        if not partitions:
            raise RouteRefused(f"every partition of queue '{queue.name}' is on {group} already")
    return await apply(host, queue, route, move(route, partitions, group, _when(host)))


async def apply(
    host: VirtualHost, queue: QueueRuntime, route: QueueRoute, new: QueueRoute
) -> QueueRoute:
    """Write version v+1 (RouteConflict: changed meanwhile) and act on it here: closed
    partitions get their command records; opening ones open at once on one node."""
    keyed_routes.check_may_close(host, queue, route, new)
    new = await place_route(host, queue, new)
    await host.store.create_queue(queue.queue_id, len(new.partitions))
    await host.meta.set_route(new, route)
    new = await _act_on(host, queue, new)
    log.info("queue %r in vhost %r: route version %d (%s)", queue.name, host.name, new.version,
             new.versions[-1].change)  # fmt: skip
    await open_when_read(host, queue)
    assert queue.route is not None
    return queue.route


async def _act_on(host: VirtualHost, queue: QueueRuntime, new: QueueRoute) -> QueueRoute:
    """A version just written: publishers here follow it, and the partitions it closes get
    their command records (keyed_routes.close). The route as it stands after."""
    closing = [p.partition for p in new.partitions if p.state == "closing"]
    if closing:
        return await keyed_routes.close(host, queue, new, closing)
    queue.set_route(new)
    host.route_epoch += 1
    return new


async def open_when_read(host: VirtualHost, queue: QueueRuntime, force: bool = False) -> bool:
    """Open the ``opening`` partitions once they are read: on one node now; on a cluster
    when this gateway holds their leases (it delivers the queue), or with ``force`` (the
    keeper's, after OPEN_GRACE_S). True if they opened here."""
    route = queue.route
    if route is None:
        return False
    opening = [p.partition for p in route.partitions if p.state == "opening"]
    if not opening or not (force or all(queue.holds_lease(p) for p in opening)):
        return False
    new = opened(route, opening)
    try:
        await host.meta.set_route(new, route)
    except RouteConflict:  # opened by another gateway: follow
        await keyed_routes.follow(host, queue)
        return False
    await _act_on(host, queue, new)  # a move: writes go to the new partitions from now on
    log.info("queue %r in vhost %r: partition(s) %s open%s; publishers write there now",
             queue.name, host.name, ", ".join(map(str, opening)),
             " (nobody delivers the queue)" if force else " (read-first)")  # fmt: skip
    return True


def check_pin(host: VirtualHost, queue: QueueRuntime, group: str) -> None:
    """A move to ``group`` must not break the queue's pin (meta/group_pins.py)."""
    pins = host.pins(queue.definition)
    if pins and group not in pins:
        raise RouteRefused(f"queue '{queue.name}' is pinned to broker group(s) "
                           f"{', '.join(pins)}: moving to {group} would break the pin")  # fmt: skip


def _groups_for(host: VirtualHost, queue: QueueRuntime, route: QueueRoute, count: int) -> list[str]:
    """Broker groups for ``count`` new partitions: the live ones (of its pin) holding the
    fewest of the queue's open partitions first ("" on the embedded node)."""
    placement = host.placement
    if placement is None:
        return [""] * count
    held = Counter(route.partitions[p].group for p in route.open_partitions())
    return spread_partitions(count, placement.usable(host.pins(queue.definition)), held)


async def place_route(host: VirtualHost, queue: QueueRuntime, new: QueueRoute) -> QueueRoute:
    """A cluster: the new partitions placed on their groups before the store queue grows
    there. Two gateways racing: the first placement stands, and the route follows it (the
    loser's version is refused by the compare-and-set anyway)."""
    placement = host.placement
    if placement is None:
        return new
    groups = [p.group or placement.groups[0] for p in new.partitions]
    placed = await placement.extend(queue.definition, groups)
    parts = tuple(
        p.model_copy(update={"group": placed[p.partition]})
        if p.partition < len(placed) and p.group != placed[p.partition] else p
        for p in new.partitions
    )  # fmt: skip
    return new.model_copy(update={"partitions": parts})


class OpeningWatch:
    """The keeper's view of partitions left opening: when each was first seen."""

    def __init__(self) -> None:
        self._since: dict[int, tuple[int, float]] = {}  # queue id -> (version, first seen)

    async def step(self, host: VirtualHost, queue: QueueRuntime, now: float) -> bool:
        """True while partitions of the queue are opening."""
        route = queue.route
        if route is None or not any(p.state == "opening" for p in route.partitions):
            self._since.pop(queue.queue_id, None)
            return False
        version, seen = self._since.get(queue.queue_id, (0, now))
        if version != route.version:
            self._since[queue.queue_id] = (route.version, now)
            seen = now
        if await open_when_read(host, queue, force=now - seen >= OPEN_GRACE_S):
            self._since.pop(queue.queue_id, None)
        return True
