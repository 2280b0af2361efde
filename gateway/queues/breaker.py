"""A queue's depth breaker (policy ``breaker``, meta/breaker_policy.py) and the task that
resets tripped ones.

- **Trip**, judged at the append: on one node a publish that would take the ready count past
  ``high`` trips it (``reject``: that publish is refused already); a cluster gateway judges
  after each batch it stored, by the broker's count of the queue (every gateway's appends,
  every consumer's acks; a sample at most ``SAMPLE_TTL_S`` old, gateway/cluster/backlog.py).
- **While tripped**: ``reject`` nacks every publish to the queue (and nothing else of the
  message's other queues); ``block`` holds the connections that published to it, and only
  those, by not reading them (RabbitMQ's credit flow: nothing refused or lost).
- **Reset** once the depth is below ``low``: looked at every ``WATCH_S`` while tripped
  (consumers drain it without publishing), and at every publish on one node. A cluster
  gateway looks at every breaker each ``WATCH_S``: one trips when the others' publishes
  passed high, before a publish of its own goes through.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

import anyio

from meta.breaker_policy import BreakerSpec

if TYPE_CHECKING:
    from gateway.queues.runtime import QueueRuntime

log = logging.getLogger("mqgw.breaker")
WATCH_S = 0.05
IDLE_WATCH_S = 1.0  # no breaker anywhere: a policy that adds one is seen within this


class DepthBreaker:
    def __init__(self, spec: BreakerSpec, high: int, low: int) -> None:
        self.spec = spec
        self.high = high  # trips above this depth
        self.low = low  # resets below this depth
        self.blocks = spec.action == "block"
        self.tripped = False
        self.trips = 0
        self.tripped_since = 0.0
        self.tripped_s = 0.0  # time tripped in the periods that ended
        self.refused = 0  # publishes nacked while tripped
        self.depth = 0  # as last judged
        self._reset: anyio.Event | None = None

    def judge(self, depth: int, now: float) -> str | None:
        """ "tripped" or "reset" when the state changes at this depth, else None."""
        self.depth = depth
        if not self.tripped and depth > self.high:
            self.tripped, self.tripped_since = True, now
            self.trips += 1
            return "tripped"
        if self.tripped and depth < self.low:
            self.release(now)
            return "reset"
        return None

    def release(self, now: float) -> None:
        """Reset (below low, or the queue went): held publishers go on."""
        if self.tripped:
            self.tripped = False
            self.tripped_s += now - self.tripped_since
        if self._reset is not None:
            self._reset.set()
            self._reset = None

    def reset_signal(self) -> anyio.Event:
        if self._reset is None:
            self._reset = anyio.Event()
        return self._reset

    def time_tripped(self, now: float) -> float:
        return self.tripped_s + (now - self.tripped_since if self.tripped else 0.0)

    def view(self, now: float) -> dict[str, Any]:
        return {
            "state": "tripped" if self.tripped else "closed",
            "action": self.spec.action,
            "high": self.high,
            "low": self.low,
            "depth": self.depth,
            "trips": self.trips,
            "tripped_seconds": round(self.time_tripped(now), 3),
            "refused_publishes": self.refused,
        }


def breaker_for(
    spec: BreakerSpec | None, max_length: int | None, kept: DepthBreaker | None, now: float
) -> DepthBreaker | None:
    """The breaker a queue's behaviour asks for: the one it has when nothing changed (its
    state and counts stay), a new one otherwise, None when there is nothing to measure."""
    bounds = None if spec is None else spec.bounds(max_length)
    if spec is None or bounds is None:
        if kept is not None:
            kept.release(now)
        return None
    if kept is not None and kept.spec == spec and (kept.high, kept.low) == bounds:
        return kept
    if kept is not None:
        kept.release(now)
    return DepthBreaker(spec, *bounds)


def note(queue: QueueRuntime, change: str | None) -> None:
    """The log line of a trip or a reset."""
    breaker = queue.breaker
    if change is None or breaker is None:
        return
    vhost = queue.definition.vhost
    if change == "tripped":
        what = ("publishes to it are refused" if not breaker.blocks
                else "its publishers are held")  # fmt: skip
        log.warning("queue %r in vhost %r: depth breaker tripped at %d ready messages (high "
                    "%d): %s until below %d", queue.name, vhost, breaker.depth, breaker.high,
                    what, breaker.low)  # fmt: skip
    else:
        log.info("queue %r in vhost %r: depth breaker reset at %d ready messages (low %d), "
                 "after %.1f s", queue.name, vhost, breaker.depth, breaker.low,
                 breaker.tripped_s)  # fmt: skip


class BreakerWatch:
    """Judges queues' breakers by their depth (``depth``: the runtime's exact count on one
    node, the broker's on a cluster) after appends, and every WATCH_S those tripped."""

    def __init__(
        self,
        queues: Callable[[], Iterable[QueueRuntime]],
        depth: Callable[[QueueRuntime], Awaitable[int]],
        now: Callable[[], float],
    ) -> None:
        self.queues = queues
        self.depth = depth
        self.now = now
        # A cluster: every breaker is looked at each WATCH_S, not only the tripped ones, so
        # that a gateway trips when others' publishes pass high (before its own next one).
        self.watch_all = False

    async def judge(self, queue: QueueRuntime) -> None:
        if queue.breaker is None:
            return
        try:
            depth = await self.depth(queue)
        except Exception as error:  # the broker away: the state stays as it is
            log.debug("queue %r: depth breaker not judged: %s", queue.name, error)
            return
        if queue.breaker is not None:
            note(queue, queue.breaker.judge(depth, self.now()))

    async def pass_once(self) -> bool:
        """One look; False if no queue has a breaker (the next look can wait longer)."""
        seen = False
        for queue in list(self.queues()):
            breaker = queue.breaker
            if breaker is None:
                continue
            seen = True
            if not (breaker.tripped or self.watch_all):
                continue
            if queue.deleted:
                breaker.release(self.now())
                continue
            await self.judge(queue)
        return seen

    async def run(self) -> None:
        while True:  # thousands of queues and no breaker: one walk over them a second
            await anyio.sleep(WATCH_S if await self.pass_once() else IDLE_WATCH_S)
