"""A plain queue of several partitions delivered by every gateway with consumers on it, each
its own partitions (RabbitMQ delivers a queue from its one home node; here more partitions
add delivery capacity, not only disk and write capacity).

Every ``RENEW_EVERY_S`` each gateway reads which gateways have consumers on such a queue
(their consumer claims, meta/cluster_views.py) and takes its place among them, sorted by
name: slot i of n delivers every n-th partition not removed, from the i-th
(``DeliveryLeases.wants_partition``). Every gateway computes the same split from the same
claims; while they differ (a claim not yet seen) the delivery leases still give each
partition one holder, and the one that wants a partition it does not hold tries again every
``RETRY_S``. Per-channel FIFO holds: a channel writes to one partition, and one gateway at a
time reads each. A queue that may not be split (``spreads_delivery``) keeps one gateway.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.queues.runtime import QueueRuntime

Claimers = Callable[[list[tuple[str, str]]], Awaitable[dict[tuple[str, str], list[str]]]]


async def place_slots(
    queues: Iterable[QueueRuntime], claimers: Claimers, gateway_id: str
) -> list[QueueRuntime]:
    """Set each queue's ``delivery_slot``; the queues whose slot changed (to be woken: what
    this gateway may deliver changed). Raises MetadataUnavailable (slots stay as they are)."""
    spread: list[QueueRuntime] = []
    changed: list[QueueRuntime] = []
    for queue in queues:
        if queue.leases is None or queue.partitions < 2 or queue.deleted:
            continue
        if queue.consumers and queue.spreads_delivery():
            spread.append(queue)
        elif queue.delivery_slot is not None:
            queue.delivery_slot = None
            changed.append(queue)
    found = await claimers([(q.definition.vhost, q.name) for q in spread])
    for queue in spread:
        names = found.get((queue.definition.vhost, queue.name), [])
        slot = (names.index(gateway_id), len(names)) if gateway_id in names else None
        if slot != queue.delivery_slot:
            queue.delivery_slot = slot
            changed.append(queue)
    return changed
