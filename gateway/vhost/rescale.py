"""Rescaling a keyed-order queue: split, merge, move, or a number of partitions reached step
by step (docs/ordering.md; the route's rules are meta/queue_route.py's); and the keeper that
drives the changes of every queue on a route (a plain one's too: gateway/vhost/elastic.py).

One step:
1. version v+1 is planned (refused with the reason when QMQ's constraints say no), the store
   queue gains the new partitions, and v+1 is written with a compare-and-set on v;
2. publishers use v+1 at once, and the command record is appended to each closed partition
   with no yield in between: every message routed by v reached its partition before the
   record (a batch routed before and appended after is routed again: ``VirtualHost.reroute``);
3. the record's offset is written into the route (the partition drains now);
4. ``RouteKeeper`` removes a draining partition once the store's committed offset reached its
   record, which opens the gate of the partitions that replaced it.

A stop between 1 and 3 is completed at the next start (keyed_routes.finish_closing).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import anyio

from gateway.queues.ordered import OrderedRuntime
from gateway.queues.runtime import QueueRuntime
from gateway.vhost import keyed_routes
from gateway.vhost.elastic import OpeningWatch, place_route
from gateway.vhost.host import VirtualHost
from meta.errors import MetaError, RouteConflict
from meta.queue_route import (
    QueueRoute,
    RouteRefused,
    merge,
    move,
    next_step,
    removed,
    split,
)
from storage import QUEUE_GROUP, StoreError

log = logging.getLogger("mqgw.rescale")
KEEP_EVERY_S = 0.05  # how often a change in progress is looked at
CLOSING_GRACE_S = 2.0  # a change left closing this long by its gateway is closed by another
REMOVED_CHECK_S = 30.0  # how often removed partitions' committed offsets are looked at


@dataclass(frozen=True)
class Step:
    """``split`` (partition, at), ``merge`` (partition, other) or ``move`` (partition, group)."""

    kind: str
    partition: int
    other: int | None = None
    at: int | None = None
    group: str = ""


def plan(route: QueueRoute, step: Step, when: str) -> QueueRoute:
    if step.kind == "split":
        return split(route, step.partition, step.at, when)
    if step.kind == "merge":
        if step.other is None:
            raise RouteRefused("merge needs two partitions")
        return merge(route, step.partition, step.other, when)
    if step.kind == "move":
        return move(route, step.partition, step.group, when)
    raise RouteRefused(f"unknown change {step.kind!r}")


async def apply_step(host: VirtualHost, queue: OrderedRuntime, step: Step) -> QueueRoute:
    """Steps 1-3 above; the new route, its closed partitions draining."""
    route = queue.route
    wall_ms = host.scheduler.clock.wall_ms()
    new = plan(_on_groups(host, queue, route), step, keyed_routes.iso_now(wall_ms))
    keyed_routes.check_may_close(host, queue, route, new)
    new = await place_route(host, queue, new)
    await host.store.create_queue(queue.queue_id, len(new.partitions))
    await host.meta.set_route(new, route)  # RouteConflict: changed meanwhile
    closing = [p.partition for p in new.partitions if p.state == "closing"]
    updated = await keyed_routes.close(host, queue, new, closing)
    log.info("queue %r in vhost %r: route version %d (%s); partition(s) %s closed",
             queue.name, host.name, updated.version, updated.versions[-1].change,
             ", ".join(map(str, closing)))  # fmt: skip
    return updated


def _on_groups(host: VirtualHost, queue: OrderedRuntime, route: QueueRoute) -> QueueRoute:
    """A cluster: the route's partitions with the broker groups the placement holds them on
    (a split keeps its group, a merge takes the lower's); the embedded node: as it is."""
    placement = host.placement
    groups = placement(queue.queue_id) if placement is not None else None
    if not groups:
        return route
    parts = tuple(
        p.model_copy(update={"group": groups[p.partition]}) if p.partition < len(groups) else p
        for p in route.partitions
    )
    return route.model_copy(update={"partitions": parts})


async def advance(host: VirtualHost, queue: QueueRuntime) -> bool:
    """Remove the draining partitions whose every message before the command record is
    settled (committed in the store: nobody needs to read the record itself, so a partition
    with no consumer left drains once it is empty); True if a change is still in progress."""
    route = queue.route
    assert route is not None
    draining = [p for p in route.partitions if p.state == "draining"]
    if not draining:
        return route.in_progress() is not None
    if queue.commit_dirty:
        await queue.commit()
    updated = route
    for part in draining:
        assert part.closed_at is not None
        committed = await host.store.committed_offset(QUEUE_GROUP, queue.queue_id, part.partition)
        if committed >= part.closed_at:  # all before the record settled (it is inert)
            updated = removed(updated, part.partition)
    if updated is not route:
        try:
            await host.meta.set_route(updated, route)
        except RouteConflict:  # another gateway's keeper removed them first
            await keyed_routes.follow(host, queue)
            return queue.route is not None and queue.route.in_progress() is not None
        queue.set_route(updated)
        if updated.in_progress() is None:
            log.info("queue %r in vhost %r: route version %d complete", queue.name, host.name,
                     updated.version)  # fmt: skip
    return updated.in_progress() is not None


class RouteKeeper:
    """Drives the changes in progress on this gateway to completion, and queues towards the
    partition counts asked for (``mqgw queue rescale --partitions N``), a step at a time."""

    def __init__(
        self,
        queues: Callable[[], Iterable[tuple[VirtualHost, QueueRuntime]]],
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.queues = queues
        self.now = now
        self._work = anyio.Event()
        # queue id -> (version, when this gateway first saw it closing): the gateway making
        # the change appends its command records within milliseconds; one that stopped in
        # between left it to the others (CLOSING_GRACE_S).
        self._closing_since: dict[int, tuple[int, float]] = {}
        self._removed_checked: dict[int, float] = {}  # queue id -> when last looked at
        self._opening = OpeningWatch()  # a plain queue's grow or move (elastic.py)

    def poke(self) -> None:
        """A change began: look at it now and until it completes."""
        self._work.set()

    async def aim(self, host: VirtualHost, queue: OrderedRuntime, partitions: int) -> None:
        """Take the queue to ``partitions`` open partitions, a step at a time (the target is
        kept in the route: a restart carries on towards it)."""
        route = queue.route
        step = next_step(route, partitions)  # RouteRefused for a count out of range
        if step is not None and host.closing_refused is not None:  # every step closes one
            raise RouteRefused(f"queue '{queue.name}': {host.closing_refused}")
        aimed = route.model_copy(update={"target": partitions})
        await host.meta.set_route(aimed, route)
        queue.set_route(aimed)
        self.poke()

    def target(self, queue: QueueRuntime) -> int | None:
        return None if queue.route is None else queue.route.target

    async def pass_once(self) -> bool:
        """One look at every keyed queue; True if a change is still in progress."""
        busy = False
        for host, queue in list(self.queues()):
            if queue.deleted:
                continue
            try:
                busy = await self._advance(host, queue) or busy
                await self.check_removed(host, queue)
            except RouteConflict:  # another gateway changed it first: follow, look again
                await keyed_routes.follow(host, queue)
                busy = True
            except (StoreError, MetaError) as error:  # retried on the next pass
                log.warning("queue %r: route change not advanced: %s", queue.name, error)
                busy = True
            except Exception:
                log.exception("queue %r: route change not advanced", queue.name)
                busy = True
        return busy

    async def _advance(self, host: VirtualHost, queue: QueueRuntime) -> bool:
        if await self._opening.step(host, queue, self.now()):
            return True
        if await self._left_closing(host, queue):
            return True
        if await advance(host, queue):
            return True
        route = queue.route
        if route is None or route.target is None or not isinstance(queue, OrderedRuntime):
            return False
        step = next_step(route, route.target)
        if step is None:
            reached = route.model_copy(update={"target": None})
            await host.meta.set_route(reached, route)
            queue.set_route(reached)
            log.info("queue %r in vhost %r: %d partitions reached", queue.name, host.name,
                     route.target)  # fmt: skip
            return False
        kind, parts = step
        await apply_step(host, queue, Step(kind, parts[0], parts[1] if len(parts) > 1 else None))
        return True

    async def check_removed(self, host: VirtualHost, queue: QueueRuntime) -> None:
        """Every REMOVED_CHECK_S: a removed partition whose committed offset in the store
        is not past its command record (on a cluster, a broker master killed before its slave
        had the last commits; or nobody read the record) is committed past it, so that it
        holds no log back: at once on the embedded node, by the gateway taking its lease for
        that moment on a cluster (``behind_removed``)."""
        now = self.now()
        if now - self._removed_checked.get(queue.queue_id, -REMOVED_CHECK_S) < REMOVED_CHECK_S:
            return
        self._removed_checked[queue.queue_id] = now
        for part in () if queue.route is None else queue.route.partitions:
            p = part.partition
            if part.state != "removed" or part.closed_at is None or p in queue.behind_removed:
                continue
            committed = await host.store.committed_offset(QUEUE_GROUP, queue.queue_id, p)
            if committed > part.closed_at:
                continue
            stats = await host.store.queue_stats(queue.queue_id)
            if p >= len(stats.partitions) or stats.partitions[p].max_offset <= part.closed_at:
                continue  # its records are not there: re-pointed off a retired group
            if committed < part.closed_at:  # at the record itself: nobody read it, as may be
                log.warning("queue %r in vhost %r: removed partition %d is committed to %d, "
                            "below its command record at %d; committing past it", queue.name,
                            host.name, p, committed, part.closed_at)  # fmt: skip
            if queue.leases is None:
                queue.pass_removed_records()
                queue.commit_dirty = True
                await queue.commit()
            else:
                queue.behind_removed.add(p)

    async def _left_closing(self, host: VirtualHost, queue: QueueRuntime) -> bool:
        """A change whose command records are not in the route: True while it waits for the
        gateway making it; past the grace, this one appends them (keyed_routes)."""
        route = queue.route
        if route is None or not any(p.state == "closing" for p in route.partitions):
            self._closing_since.pop(queue.queue_id, None)
            return False
        version, seen = self._closing_since.get(queue.queue_id, (0, 0.0))
        if version != route.version:
            self._closing_since[queue.queue_id] = (route.version, self.now())
            return True
        if self.now() - seen < CLOSING_GRACE_S:
            return True
        del self._closing_since[queue.queue_id]
        log.warning("queue %r in vhost %r: route version %d was left without its command "
                    "records (its gateway stopped?); appending them here", queue.name,
                    host.name, route.version)  # fmt: skip
        await keyed_routes.finish_closing(host, queue)
        return True

    async def run(self) -> None:
        while True:
            if not await self.pass_once():
                self._work = anyio.Event()
                with anyio.move_on_after(1.0):  # a change made elsewhere (a restart) too
                    await self._work.wait()
            else:
                await anyio.sleep(KEEP_EVERY_S)


def settled(queue: QueueRuntime, keeper: RouteKeeper) -> bool:
    """No change in progress and no partition count still to reach."""
    route = queue.route
    return route is None or (route.in_progress() is None and keeper.target(queue) is None)
