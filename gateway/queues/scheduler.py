"""The push scheduler: a few tasks serve a ready-set of queues (vivo's design).

A queue is woken (put in the ready-set) when something may let it deliver: a publish into it,
a new consumer, an ack or requeue that returns credit, channel.flow, a drained socket, an
operator's resume, a TTL or x-expires deadline. A push task takes the oldest ready queue,
refills its buffer from the store when it runs low, and delivers at most ``quota`` messages
before putting it back at the end, so one hot queue cannot starve the rest. A queue with no
credit, no messages or paused leaves the set and costs nothing until woken. A queue waiting
for a time (a rate-limit token, its head's TTL deadline, its x-expires) is parked on one timer
heap shared by the whole node; a single timer task wakes it then.
There is no task, thread or timer per queue or per consumer.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable

import anyio

from gateway.observe.histogram import Histogram
from gateway.queues import plain_turn
from gateway.queues.clock import SYSTEM_CLOCK, Clock
from gateway.queues.intake import FLOW_LOW
from gateway.queues.runtime import PumpResult, QueueRuntime
from storage import StoreError, twins

# queue.pump, or for a plain queue with one consumer its compiled turn (plain_turn.py).
pump = twins.pick(plain_turn.pump)
RETRY_S = 0.5  # a queue whose store call failed is served again after this

log = logging.getLogger("mqgw.push")

YIELD_EVERY_S = 0.002  # a push task gives the event loop a turn at least this often


class PushScheduler:
    def __init__(self, tasks: int = 2, quota: int = 64, clock: Clock = SYSTEM_CLOCK) -> None:
        self.tasks = tasks
        self.quota = quota
        self.clock = clock  # the node's: queues, controls and features read the same one
        self._ready: deque[QueueRuntime] = deque()
        self._wakeup = anyio.Event()
        self._timers: list[tuple[float, int, QueueRuntime]] = []
        self._failing: set[int] = set()  # ids of queues whose last turn met a store error
        self._timer_changed = anyio.Event()
        self._sequence = itertools.count()
        self.turn_time = Histogram()  # seconds per turn (mqgw_scheduler_turn_seconds)
        # Called (by a push task) for a queue whose x-expires passed while unused.
        self.on_unused: Callable[[QueueRuntime], Awaitable[None]] | None = None
        # A feature that takes over a queue's wake-ups plugs in here: given the queue, it
        # returns what to wake instead, or None for the queue itself (broadcast consumption
        # wakes the consumers' subscriptions, gateway/features/broadcast.py).
        self.redirect: Callable[[QueueRuntime], Iterable[QueueRuntime] | None] | None = None

    @property
    def ready_count(self) -> int:
        return len(self._ready)

    def wake(self, queue: QueueRuntime) -> None:
        if self.redirect is not None:
            instead = self.redirect(queue)
            if instead is not None:
                for other in instead:
                    self._wake(other)
                return
        self._wake(queue)

    def _wake(self, queue: QueueRuntime) -> None:
        if queue.deleted:
            return
        if queue.scheduled:
            queue.rewake = True  # being served: serve again after this turn
            return
        queue.scheduled = True
        self._ready.append(queue)
        self._wakeup.set()

    def wake_new_messages(self, queue: QueueRuntime) -> None:
        """Messages were appended to ``queue``: its next fetch is worth doing."""
        queue.exhausted = False
        self.wake(queue)

    def serve_fed(self, queue: QueueRuntime) -> None:
        """A queue just fed from the publisher's batch (``queue.fed``, see VirtualHost._absorb)
        delivers now, in the publisher's task, what its consumers can take: the turn a wake
        would give it, whose store read the feed makes unnecessary. A queue already in the
        ready set, or one with timers to look after (TTL, x-expires), takes that turn."""
        b = queue.behaviour
        if (
            queue.scheduled
            or not queue.fed
            or b.message_ttl_ms is not None
            or queue.expirations_seen
            or b.expires_ms is not None
        ):
            self.wake(queue)
            return
        try:
            result = pump(queue, self.quota, self.clock.monotonic())
        except Exception:  # as in a turn: logged, and the publisher goes on
            log.exception("push to queue %r failed", queue.name)
            return
        if queue.caught_up_event is not None:  # _release_after's test, without its call
            _release_after(queue, result)
        if result is PumpResult.QUOTA_USED:
            self.wake(queue)
        elif result is PumpResult.RATE_LIMITED:
            self._park(queue, queue.rate_wake_at)

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(self.tasks):
                tg.start_soon(self._push_loop)
            tg.start_soon(self._timer_loop)

    async def _push_loop(self) -> None:
        # Slices of real CPU time, not of the node's clock: a fake clock in a test must not
        # keep a push task from yielding.
        clock = time.perf_counter
        yielded = clock()
        while True:
            if not self._ready:
                self._wakeup = anyio.Event()
                await self._wakeup.wait()
                yielded = clock()
                continue
            await self.turn()
            # Let readers and writers run, but not after every turn: with thousands of queues
            # holding a message or two each, a loop iteration per turn costs more than the turn.
            now = clock()
            if now - yielded >= YIELD_EVERY_S:
                await anyio.lowlevel.checkpoint()
                yielded = clock()

    async def turn(self) -> bool:
        """Serve the oldest ready queue once; False if none was ready."""
        if not self._ready:
            return False
        queue = self._ready.popleft()
        started = time.perf_counter()  # measures work done, like the yield slices
        try:
            again = await self._serve(queue)
        except StoreError as error:
            # The store (a broker, in a cluster) is away: try this queue again shortly (a
            # line when it starts failing, not one per try while a broker group is down).
            if queue.queue_id not in self._failing:
                self._failing.add(queue.queue_id)
                log.warning("push to queue %r: %s; retrying every %.1f s", queue.name, error,
                            RETRY_S)  # fmt: skip
            queue.scheduled = False
            self._park(queue, self.clock.monotonic() + RETRY_S)
            return True
        except Exception:
            log.exception("push to queue %r failed", queue.name)
            again = False
        queue.scheduled = False
        if self._failing:
            self._failing.discard(queue.queue_id)
        self.turn_time.observe(time.perf_counter() - started)
        if (again or queue.rewake) and not queue.deleted:
            queue.rewake = False
            self.wake(queue)
        return True

    async def _serve(self, queue: QueueRuntime) -> bool:
        queue.rewake = False
        now = self.clock.monotonic()
        if queue.consumers and not queue.paused and queue.may_serve():
            await queue.fill()
            if queue.leases is not None and queue.behaviour.has_limits and queue.over_limit():
                await queue.enforce_limits()  # cluster: the fill counted others' publishes in
            result = pump(queue, self.quota, now)
            _release_after(queue, result)
            if result is PumpResult.QUOTA_USED:
                return True
            if result is PumpResult.NO_MESSAGES and not queue.exhausted:
                return True  # the last fetch was full: there may be more
            if result is PumpResult.RATE_LIMITED:
                self._park(queue, queue.rate_wake_at)
        queue.release_publishers()  # no consumer, or paused: publishers must not wait on it
        # Nobody takes the head now: let what expired leave, and come back when more will.
        behaviour = queue.behaviour
        if behaviour.message_ttl_ms is not None or queue.expirations_seen:
            now_ms = self.clock.wall_ms()
            deadline = await queue.expire(now_ms)
            if deadline is not None:
                self._park(queue, now + max(0, deadline - now_ms + 1) / 1000)
        if behaviour.expires_ms is not None and not queue.consumers and self.on_unused:
            idle_until = queue.last_used + behaviour.expires_ms / 1000
            if now >= idle_until:
                await self.on_unused(queue)
            else:
                self._park(queue, idle_until)
        return False

    # -- rate-limit timers: one heap and one task for the whole node ----------------------

    def _park(self, queue: QueueRuntime, when: float) -> None:
        if queue.parked_until and queue.parked_until <= when:
            return  # an earlier wake-up is already set; it re-parks the queue if needed
        queue.parked_until = when
        heapq.heappush(self._timers, (when, next(self._sequence), queue))
        self._timer_changed.set()

    def wake_due(self, now: float) -> float | None:
        """Wake parked queues whose token is back; returns when the next one is due."""
        while self._timers and self._timers[0][0] <= now:
            when, _, queue = heapq.heappop(self._timers)
            if queue.parked_until == when:
                queue.parked_until = 0.0
            self.wake(queue)
        return self._timers[0][0] if self._timers else None

    async def _timer_loop(self) -> None:
        while True:
            self._timer_changed = anyio.Event()
            due = self.wake_due(self.clock.monotonic())
            with anyio.move_on_after(
                3600 if due is None else max(0.0, due - self.clock.monotonic())
            ):
                await self._timer_changed.wait()


def _release_after(queue: QueueRuntime, result: PumpResult) -> None:
    """After a pump: publishers waiting on ``queue`` go on once it is below FLOW_LOW or could
    deliver no more now (waiting would not help)."""
    if queue.caught_up_event is not None and (
        result is not PumpResult.QUOTA_USED or queue.ready_count <= FLOW_LOW
    ):
        queue.release_publishers()
