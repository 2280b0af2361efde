"""The push scheduler: a few tasks serve a ready-set of queues (vivo's design).

A queue is woken (put in the ready-set) when something may let it deliver: a publish into it,
a new consumer, an ack or requeue that returns credit, a channel.flow or a drained socket. A
push task takes the oldest ready queue, refills its buffer if low, and delivers at most
``quota`` messages before putting it back at the end, so one hot queue cannot starve the
rest. A queue with no credit or no messages leaves the set and costs nothing until woken.
There is no task, thread or timer per queue or consumer.
"""

from __future__ import annotations

import logging
from collections import deque

import anyio

from gateway.queue_runtime import PumpResult, QueueRuntime

log = logging.getLogger("mqgw.push")


class PushScheduler:
    def __init__(self, tasks: int = 2, quota: int = 64) -> None:
        self.tasks = tasks
        self.quota = quota
        self._ready: deque[QueueRuntime] = deque()
        self._wakeup = anyio.Event()
        self.turns = 0

    def wake(self, queue: QueueRuntime) -> None:
        if queue.deleted:
            return
        if queue.scheduled:
            queue.rewake = True  # being served: serve again after this turn
            return
        queue.scheduled = True
        self._ready.append(queue)
        self._wakeup.set()

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            for _ in range(self.tasks):
                tg.start_soon(self._push_loop)

    async def _push_loop(self) -> None:
        while True:
            if not self._ready:
                self._wakeup = anyio.Event()
                await self._wakeup.wait()
                continue
            queue = self._ready.popleft()
            try:
                again = await self._serve(queue)
            except Exception:
                log.exception("push to queue %r failed", queue.name)
                again = False
            queue.scheduled = False
            if (again or queue.rewake) and not queue.deleted:
                queue.rewake = False
                self.wake(queue)
            await anyio.lowlevel.checkpoint()  # let readers and writers run between turns

    async def _serve(self, queue: QueueRuntime) -> bool:
        self.turns += 1
        queue.rewake = False
        if not queue.consumers:
            return False
        await queue.fill()
        result = queue.pump(self.quota)
        if result is PumpResult.QUOTA_USED:
            return True
        if result is PumpResult.NO_MESSAGES:
            return not queue.exhausted  # the last fetch was full: there may be more
        return False
