"""Automatic scaling by policy (``autoscale``, meta/autoscale_policy.py; docs/elastic-queues.md).

Every ``TICK_S`` the gateway that delivers a queue (every gateway on the embedded node: the
one) looks at its depth (ready messages: the runtime's count here, the broker's on a
cluster), its consumer lag (age of the oldest ready message read into memory) and whether
anything was published. ``decide`` is the rule, pure and on the clock it is given: one
partition more once depth or lag stayed above the bound for the window, one fewer once the
queue stayed idle for the window, never outside [min, max], never while a change is in
progress, and each step starts the window again. Every decision is logged and kept (the
last ``KEPT``) for /api/queues.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio

from gateway.features.queue_kinds import scale_refusal
from gateway.queues.ordered import OrderedRuntime
from gateway.queues.runtime import QueueRuntime
from gateway.vhost import elastic, keyed_routes
from gateway.vhost.host import VirtualHost
from gateway.vhost.rescale import RouteKeeper
from meta.autoscale_policy import AutoscaleSpec
from meta.errors import MetaError, RouteConflict
from meta.queue_route import RouteRefused
from storage import StoreError

log = logging.getLogger("mqgw.autoscale")
TICK_S = 0.5
IDLE_TICK_S = 2.0
KEPT = 20


@dataclass
class ScaleState:
    above_since: float | None = None
    idle_since: float | None = None
    enqueued: int = -1
    decisions: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=KEPT))


def decide(
    spec: AutoscaleSpec, state: ScaleState, partitions: int, depth: int, lag_s: float | None,
    published: bool, now: float,
) -> tuple[int, str] | None:  # fmt: skip
    """The next partition count and why, or None; ``state`` keeps the windows."""
    over_depth = spec.depth is not None and depth > spec.depth
    over_lag = spec.lag_s is not None and lag_s is not None and lag_s > spec.lag_s
    idle = depth == 0 and not published
    state.above_since = (state.above_since or now) if over_depth or over_lag else None
    state.idle_since = (state.idle_since or now) if idle else None
    if partitions < spec.low:
        return partitions + 1, f"below min {spec.low}"
    if partitions > spec.high:
        return partitions - 1, f"above max {spec.high}"
    above = state.above_since is not None and now - state.above_since >= spec.window_s
    if above and partitions < spec.high:
        why = (f"depth {depth} above {spec.depth}" if over_depth
               else f"lag {lag_s or 0:.1f} s above {spec.lag_s or 0:g} s")  # fmt: skip
        return partitions + 1, f"{why} for {spec.window_s:g} s"
    quiet = state.idle_since is not None and now - state.idle_since >= spec.window_s
    if quiet and partitions > spec.low:
        return partitions - 1, f"idle for {spec.window_s:g} s"
    return None


def lag_of(queue: QueueRuntime, now_ms: int) -> float | None:
    oldest = min((m.store_ts_ms for _, m in queue.held()), default=None)
    return None if oldest is None else max(0, now_ms - oldest) / 1000


def open_count(queue: QueueRuntime) -> int:
    route = queue.route
    return queue.partitions if route is None else len(route.open_partitions())


class Autoscaler:
    def __init__(
        self,
        queues: Callable[[], Iterable[tuple[VirtualHost, QueueRuntime]]],
        depth: Callable[[QueueRuntime], Awaitable[int]],
        keeper: RouteKeeper,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.queues = queues
        self.depth = depth
        self.keeper = keeper
        self.now = now
        self._states: dict[int, ScaleState] = {}

    def view(self, queue: QueueRuntime) -> dict[str, Any] | None:
        spec = queue.behaviour.autoscale
        if spec is None:
            return None
        state = self._states.get(queue.queue_id, ScaleState())
        now = self.now()
        return {
            "min": spec.low, "max": spec.high, "depth": spec.depth, "lag_s": spec.lag_s,
            "window_s": spec.window_s, "open_partitions": open_count(queue),
            "deciding_here": self._decides_here(queue),
            "above_for_s": None if state.above_since is None else round(now - state.above_since, 1),
            "idle_for_s": None if state.idle_since is None else round(now - state.idle_since, 1),
            "decisions": list(state.decisions),
        }  # fmt: skip

    def _decides_here(self, queue: QueueRuntime) -> bool:
        """The gateway delivering the queue's lowest partition decides (one per cluster)."""
        return queue.leases is None or queue.holds_lead()

    async def pass_once(self) -> bool:
        """One look at every queue with the policy; False if there is none."""
        live = set()
        for host, queue in list(self.queues()):
            spec = queue.behaviour.autoscale
            if spec is None or queue.deleted or scale_refusal(queue) is not None:
                continue
            live.add(queue.queue_id)
            if not self._decides_here(queue):
                self._states.pop(queue.queue_id, None)
                continue
            try:
                await self._look(host, queue, spec)
            except (StoreError, MetaError, RouteRefused, RouteConflict) as error:
                log.warning("queue %r in vhost %r: autoscale not applied: %s", queue.name,
                            host.name, error)  # fmt: skip
        for queue_id in [q for q in self._states if q not in live]:
            del self._states[queue_id]
        return bool(live)

    async def _look(self, host: VirtualHost, queue: QueueRuntime, spec: AutoscaleSpec) -> None:
        state = self._states.setdefault(queue.queue_id, ScaleState())
        published = state.enqueued not in (-1, queue.enqueued)
        state.enqueued = queue.enqueued
        route = queue.route
        if route is not None and (route.in_progress() or route.target is not None):
            return  # one step at a time
        depth = await self.depth(queue)
        now = self.now()
        lag = lag_of(queue, time.time_ns() // 1_000_000)
        partitions = open_count(queue)
        step = decide(spec, state, partitions, depth, lag, published, now)
        if step is None:
            return
        target, why = step
        log.info("queue %r in vhost %r: autoscale %d -> %d partitions (%s)", queue.name,
                 host.name, partitions, target, why)  # fmt: skip
        state.decisions.append({"at": keyed_routes.iso_now(time.time_ns() // 1_000_000),
                                "from": partitions, "to": target, "why": why})  # fmt: skip
        state.above_since = state.idle_since = None  # the next step needs a whole window
        if isinstance(queue, OrderedRuntime):
            await self.keeper.aim(host, queue, target)
        else:
            await elastic.scale(host, queue, target)
        self.keeper.poke()

    async def run(self) -> None:
        while True:  # no queue with the policy: one walk over the queues every IDLE_TICK_S
            await anyio.sleep(TICK_S if await self.pass_once() else IDLE_TICK_S)
