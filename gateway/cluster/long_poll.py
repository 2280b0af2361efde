"""Long-poll reads for the partitions this gateway delivers: a holder does not hear of
publishes made on other gateways, so for each held partition with consumers here and nothing
in hand it keeps one read waiting on the broker (``wait_ms``, ``LONG_POLL_MS``), answered as
soon as something is appended there; then the queue fills as usual. ``LongPollReads.keep``
starts and cancels one watcher task per such partition (the cluster link's lease loop calls
it each round); a watcher whose read is refused (StaleFence) marks the lease lost.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from gateway.cluster.timings import LONG_POLL_MS, POLL_S, RETRY_S
from storage import ReadStatus, StoreError
from storage.errors import StaleFence

if TYPE_CHECKING:
    from gateway.ports import ClusterNode
    from gateway.queues.runtime import QueueRuntime

log = logging.getLogger("mqgw.cluster")


class LongPollReads:
    """The watcher tasks of one gateway (see the module doc). ``held`` is the delivery
    leases' map of held partitions (read, never changed here)."""

    def __init__(self, node: ClusterNode, held: Mapping[tuple[int, int], int]) -> None:
        self.node = node
        self.held = held
        # Long-poll reads, one task per delivered partition with consumers (see _watch).
        self._watchers: dict[tuple[int, int], anyio.CancelScope] = {}
        self._exhausted: dict[int, anyio.Event] = {}  # queue id -> set when it read all
        self.tasks: anyio.abc.TaskGroup | None = None  # where watchers run (the link's)

    def _watched(self, key: tuple[int, int]) -> QueueRuntime | None:
        queue = self.node.queue_by_id(key[0])
        if queue is None or queue.deleted or not queue.consumers or key not in self.held:
            return None
        return queue

    def keep(self) -> None:
        """A watcher per held partition with consumers here; the others' are cancelled."""
        for key in [k for k in self._watchers if self._watched(k) is None]:
            self._watchers.pop(key).cancel()
        for key in self.held:
            queue = self._watched(key)
            if queue is not None and key not in self._watchers and self.tasks is not None:
                scope = self._watchers[key] = anyio.CancelScope()
                queue.on_exhausted = self._queue_exhausted
                self.tasks.start_soon(self._watch, queue, key[1], scope)

    def _queue_exhausted(self, queue: QueueRuntime) -> None:
        event = self._exhausted.pop(queue.queue_id, None)
        if event is not None:
            event.set()

    async def _watch(self, queue: QueueRuntime, partition: int, scope: anyio.CancelScope) -> None:
        """While the queue has read everything: a read held on the broker from its cursor;
        when it answers with something, the queue fills (the scheduler reads it all)."""
        key = (queue.queue_id, partition)
        with scope:
            while True:
                if not (queue.exhausted and queue.may_serve()):
                    # Messages in hand: wait until a fill reads to the end (or look again
                    # shortly: some queue kinds decide exhaustion without a fill).
                    event = self._exhausted.setdefault(queue.queue_id, anyio.Event())
                    with anyio.move_on_after(POLL_S):
                        await event.wait()
                    continue
                offset, fence = queue.cursors[partition], queue.fences[partition]
                try:
                    found = await self.node.store.read(
                        queue.queue_id, partition, offset, 1, wait_ms=LONG_POLL_MS, fence=fence
                    )
                except StaleFence as error:  # taken over: the lease loop sees it lost next
                    queue.lose_lease(partition, error, fence)
                    await anyio.sleep(RETRY_S)
                    continue
                except StoreError as error:
                    log.debug("cluster: long-poll read of %r/%d: %s", queue.name, partition,
                              error)  # fmt: skip
                    await anyio.sleep(RETRY_S)
                    continue
                if found.replaced_fence:  # this copy learnt our fence here (store_reads.py)
                    queue.note_replaced(partition, found.replaced_fence, found.replaced_end)
                if found.status is ReadStatus.OFFSET_OVERFLOW:
                    await anyio.sleep(RETRY_S)  # past the end (a truncated log): no spinning
                if (found.messages or found.status is not ReadStatus.NO_NEW_MESSAGE) and (
                    queue.exhausted and queue.cursors[partition] == offset
                ):
                    queue.exhausted = False
                    self.node.scheduler.wake(queue)
        if self._watchers.get(key) is scope:
            del self._watchers[key]
