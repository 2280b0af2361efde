"""Lease hand-overs between gateways, for basic.get: a get on a gateway that does not hold
the queue's delivery leases takes those nobody holds and asks the holders of the others to
hand them over (a request over Redis, one at a time per queue, ``hold_for_get``); ``serve``
answers the other gateways' requests for leases held here: a holder with no use for them
(no consumer on the queue, no get under way, nothing of theirs delivered and unacked) commits
and gives them up at once, else answers "busy". The leases themselves are taken and given up
through ``DeliveryLeases``.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from typing import TYPE_CHECKING

import anyio

from gateway.cluster.delivery_leases import DeliveryLeases, lease_key, lease_name
from gateway.cluster.timings import (
    BUSY_S,
    HANDOVER_LISTEN_S,
    HANDOVER_WAIT_S,
    RETRY_S,
    SILENT_S,
)
from meta.errors import MetadataUnavailable
from meta.redis_store import RedisMetadataStore

if TYPE_CHECKING:
    from gateway.ports import ClusterNode
    from gateway.queues.runtime import QueueRuntime

log = logging.getLogger("mqgw.cluster")

RELEASED = "released"
BUSY = "busy"


class HandOvers:
    """The hand-over requests of one gateway, sent and answered (see the module doc)."""

    def __init__(
        self,
        node: ClusterNode,
        meta: RedisMetadataStore,
        gateway_id: str,
        leases: DeliveryLeases,
    ) -> None:
        self.node = node
        self.meta = meta
        self.gateway_id = gateway_id
        self.leases = leases
        # Per queue id, the hand-over request out for the gets here and when another may
        # be sent.
        self._asking: dict[int, anyio.Event] = {}
        self._ask_after: dict[int, float] = {}
        self._requests = itertools.count(1)
        self._run_id = uuid.uuid4().hex[:12]  # request ids stay unique across restarts

    async def hold_for_get(self, queue: QueueRuntime) -> bool:
        """basic.get here: take the queue's leases now, and keep them a while (``GET_HOLD_S``)
        for the gets that usually follow. Those another gateway holds are asked for: one
        with no use for them (no consumer on the queue there, no get under way, nothing of
        them delivered and unacked) commits and gives them up (``_hand_over``), and they are
        taken here at once. False while it does use them, or gives no answer within
        ``HANDOVER_WAIT_S`` (the get answers get-empty, as for a queue another consumer
        drains)."""
        queue.last_get = anyio.current_time()
        if queue.holds_all_leases():
            return True
        try:
            others = await self._hold_free(queue)
            if others and await self._asked_to_hand_over(queue, others):
                await self._hold_free(queue)
        except MetadataUnavailable:
            return False
        return queue.holds_all_leases()

    async def _hold_free(self, queue: QueueRuntime) -> dict[str, list[int]]:
        """Take the queue's leases nobody holds; the partitions others hold, by holder."""
        others: dict[str, list[int]] = {}
        for partition in range(queue.partitions):
            if (queue.queue_id, partition) not in self.leases.held:
                holder = await self.leases.try_hold(queue, partition)
                if holder is not None:
                    others.setdefault(holder, []).append(partition)
        return others

    async def _asked_to_hand_over(self, queue: QueueRuntime, others: dict[str, list[int]]) -> bool:
        """Ask the holders of the queue's other partitions to hand them over; True if each
        said it gave them up. One request at a time per queue: the gets that come while it
        is out wait for its answer. After "busy" no new request goes out for ``BUSY_S``,
        after no answer for ``SILENT_S``: those gets answer get-empty at once."""
        queue_id = queue.queue_id
        pending = self._asking.get(queue_id)
        if pending is not None:
            with anyio.move_on_after(HANDOVER_WAIT_S):
                await pending.wait()
            return True  # whatever it answered, holding again is cheap
        if anyio.current_time() < self._ask_after.get(queue_id, 0.0):
            return False
        self._ask_after.pop(queue_id, None)
        event = self._asking[queue_id] = anyio.Event()
        try:
            for holder, partitions in others.items():
                names = [lease_name((queue_id, p)) for p in partitions]
                request_id = f"{self.gateway_id}/{self._run_id}/{next(self._requests)}"
                answer = await self.meta.ask_hand_over(holder, names, request_id, HANDOVER_WAIT_S)
                if answer != RELEASED:
                    pause = BUSY_S if answer == BUSY else SILENT_S
                    self._ask_after[queue_id] = anyio.current_time() + pause
                    if answer is None:
                        log.info("cluster: gateway %s did not answer for queue %r within "
                                 "%.1f s", holder, queue.name, HANDOVER_WAIT_S)  # fmt: skip
                    return False
            return True
        finally:
            del self._asking[queue_id]
            event.set()

    async def serve(self) -> None:
        """Answer the other gateways' requests for leases held here (``hold_for_get``)."""
        while True:
            try:
                requests = await self.meta.hand_over_requests(self.gateway_id, HANDOVER_LISTEN_S)
                for request in requests:
                    answer = await self._hand_over(request.names)
                    await self.meta.answer_hand_over(request.request_id, answer)
            except MetadataUnavailable as error:
                log.warning("cluster: lease hand-over requests: %s", error)
                await anyio.sleep(RETRY_S)

    async def _hand_over(self, names: tuple[str, ...]) -> str:
        """Give the leases ``names`` (one queue's partitions) up if this gateway has no use
        for them: no consumer on the queue here, no get under way, nothing of theirs
        delivered and unacknowledged (a hand-over would deliver it twice). All or none."""
        keys = [k for k in (lease_key(n) for n in names) if k is not None and k in self.leases.held]
        if not keys:
            return RELEASED  # not held here (any more)
        if any(k in self.leases.taking for k in keys) or keys[0][0] in self._asking:
            return BUSY  # just taken here, or a get here asks for its other partitions
        queue = self.node.queue_by_id(keys[0][0])
        if queue is not None and not queue.deleted:
            if _in_use(queue, [p for _, p in keys]):
                return BUSY
            queue.last_get = -1e9  # the gets are the asker's now: not taken back for them
        for key in keys:
            if not await self.leases.give_up(queue, key, must_commit=True):
                return BUSY  # its broker is away: nothing given up that was not committed
        log.debug("cluster: queue %r partition(s) %s handed over on request",
                  queue.name if queue else keys[0][0], [p for _, p in keys])  # fmt: skip
        return RELEASED


def _in_use(queue: QueueRuntime, partitions: list[int]) -> bool:
    """Whether this gateway uses the queue's ``partitions``: a consumer on the queue, a
    basic.get under way, or a message of theirs delivered and not yet settled."""
    return bool(
        any(queue.wants_partition(p) for p in partitions)
        or queue.getting
        or any(queue.inflight[p] for p in partitions)
    )
