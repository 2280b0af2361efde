"""The vhost's side of queues on a route (docs/ordering.md, docs/elastic-queues.md): which
queues run on one, the command record that closes a partition, and routing a batch again
after a change. Keyed-order queues have a route from their declaration; a plain queue gets
one when it is first scaled (gateway/vhost/elastic.py).

A queue is keyed when declared with ``x-mqgw-ordering: key``, or when the policy in force at
its creation says ``ordering: key``; its route (meta/queue_route.py) is written to the
metadata store then, and from there on the route is what makes it keyed (a later policy
change does not turn a queue into another kind).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import anyio

from gateway.amqp.events import decode_properties
from meta.errors import MetaError, RouteConflict
from meta.models import Policy, QueueDef
from meta.queue_route import (
    COMMAND_EXCHANGE,
    DEFAULT_LOGICAL,
    LOGICAL_ARG,
    ORDERING_ARG,
    ORDERING_HEADER_ARG,
    ORDERING_KEY,
    QueueRoute,
    RouteRefused,
    closed,
    initial_route,
)
from storage import AppendResult, Record
from storage.record import CLOSES, PERSISTENT

if TYPE_CHECKING:
    from gateway.queues.ordered import OrderedRuntime
    from gateway.queues.runtime import QueueRuntime
    from gateway.vhost.host import VirtualHost

log = logging.getLogger("mqgw.rescale")
EMPTY_PROPERTIES = b"\x00\x00"  # no property present


def iso_now(wall_ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall_ms / 1000)) + (
        f".{wall_ms % 1000:03d}Z"
    )


def wants_order(definition: QueueDef, policy: Policy | None, creating: bool) -> bool:
    if definition.arguments.get(ORDERING_ARG) == "key":
        return True
    return creating and policy is not None and policy.definition.get(ORDERING_KEY) == "key"


async def route_of(
    host: VirtualHost, definition: QueueDef, policy: Policy | None, loading: bool
) -> QueueRoute | None:
    """The queue's route: a keyed one's (written now if it is new), a plain one's that was
    scaled; else None."""
    stored = await host.meta.get_route(host.name, definition.name)
    if stored is not None and stored.queue_id == definition.queue_id:
        return stored
    if not wants_order(definition, policy, creating=not loading):
        return None
    arguments = definition.arguments
    logical = arguments.get(LOGICAL_ARG, DEFAULT_LOGICAL)
    header = arguments.get(ORDERING_HEADER_ARG)
    route = initial_route(
        host.name, definition.name, definition.queue_id, definition.partitions,
        logical=max(int(logical), definition.partitions),
        header=None if header is None else str(header),
        at=iso_now(host.scheduler.clock.wall_ms()),
    )  # fmt: skip
    try:
        await host.meta.set_route(route, None)
    except RouteConflict:  # another gateway wrote it first: the same route, or a newer one
        stored = await host.meta.get_route(host.name, definition.name)
        if stored is not None:
            return stored
    return route


def command_record(queue_id: int, partition: int, version: int, wall_ms: int) -> Record:
    """What closes ``partition``: never delivered (its exchange no AMQP name can have); a
    broker refuses appends to the partition after it (CLOSES)."""
    body = json.dumps({"closed_in": version, "partition": partition}).encode()
    return Record(COMMAND_EXCHANGE.encode(), b"", EMPTY_PROPERTIES, body,
                  ((queue_id, partition),), wall_ms, PERSISTENT | CLOSES)  # fmt: skip


def check_may_close(host: VirtualHost, queue: QueueRuntime, route: QueueRoute | None,
                    new: QueueRoute) -> None:  # fmt: skip
    """RouteRefused when ``new`` closes a partition ``route`` had open and this vhost's
    store cannot fence it (VirtualHost.closing_refused)."""
    if host.closing_refused is None:
        return
    was = {p.partition: p.state for p in route.partitions} if route is not None else {}
    if any(p.state == "closing" and was.get(p.partition) != "closing" for p in new.partitions):
        raise RouteRefused(f"queue '{queue.name}': {host.closing_refused}")


async def append_commands(
    host: VirtualHost, queue: QueueRuntime, partitions: list[int]
) -> dict[int, int]:
    """Append the command records closing ``partitions`` (one batch); each one's offset in
    its partition."""
    wall_ms = host.scheduler.clock.wall_ms()
    route = queue.route
    assert route is not None
    records = [command_record(queue.queue_id, p, route.partitions[p].closed_in or 0, wall_ms)
               for p in partitions]  # fmt: skip
    result = await host.store.append(records, wait_durable=True)
    starts = result.queue_starts or {}
    offsets: dict[int, int] = {}
    for p in partitions:
        offset = starts.get((queue.queue_id, p))
        if offset is None:  # a store that did not say (a batch split over broker groups)
            stats = await host.store.queue_stats(queue.queue_id)
            offset = stats.partitions[p].max_offset - 1
        offsets[p] = offset
    return offsets


async def close(
    host: VirtualHost, queue: QueueRuntime, route: QueueRoute, partitions: list[int]
) -> QueueRoute:
    """Publishers on ``route`` and the command records of ``partitions`` appended, with no
    yield between (a batch routed before is routed again before its append: the vhost's
    ``route_epoch``); then their offsets written into the route: they drain from now on."""
    queue.set_route(route)
    host.route_epoch += 1
    # Counted ready before a read can meet them: a read that finds one (a basic.get while
    # the append waits for its fsync) takes it out of the count, which went below zero.
    queue.count_commands(len(partitions))
    try:
        offsets = await append_commands(host, queue, partitions)
    except BaseException:
        queue.count_commands(-len(partitions))
        raise
    updated = route
    for partition, offset in offsets.items():
        updated = closed(updated, partition, offset)
    try:
        await host.meta.set_route(updated, route)
    except RouteConflict:  # another gateway closed them first (the same offsets: see above)
        await follow(host, queue)
        assert queue.route is not None
        return queue.route
    queue.set_route(updated)
    for partition in offsets:
        queue.command_appended(partition)
    return updated


async def finish_closing(host: VirtualHost, queue: QueueRuntime) -> None:
    """At attach (and on a cluster, by the keeper of a gateway that sees a change left so):
    a change that wrote its version but not its command records (the gateway stopped in
    between) completes now. Nothing reached those partitions since: publishers used the new
    version from the moment it was written (on a cluster the broker refuses appends after a
    command record, so a second one appended is refused, and the partition's last offset is
    the first's). A command record appended before the stop and not recorded in the route
    stays in the log, inert (readers skip them all)."""
    route = queue.route
    if route is None:
        return
    closing = [p.partition for p in route.partitions if p.state == "closing"]
    if closing:
        await close(host, queue, route, closing)


def reroute(keyed: Mapping[int, QueueRuntime], records: Sequence[Record]) -> list[Record]:
    """``records`` with each routed queue's partition from its newest route (a keyed one's
    key's; a plain one's where its channel's closed partition goes, the same for all)."""
    out: list[Record] = []
    for record in records:
        if not any(queue_id in keyed for queue_id, _ in record.destinations):
            out.append(record)
            continue
        headers: Mapping[str, Any] | None = None
        destinations = []
        for queue_id, routed in record.destinations:
            queue = keyed.get(queue_id)
            if queue is None:
                destinations.append((queue_id, routed))
                continue
            if not queue.keyed:
                destinations.append((queue_id, queue.successor(routed)))
                continue
            header = cast("OrderedRuntime", queue).header
            if headers is None and header is not None:
                headers = decode_properties(bytes(record.properties)).headers or {}
            destinations.append(
                (queue_id, queue.key_partition(record.routing_key.decode(), headers))
            )
        out.append(record._replace(destinations=tuple(destinations)))
    return out


# -- a cluster: changes made on other gateways ---------------------------------------------

REROUTES = 3  # a batch refused more often than this (changes in quick succession): nacked
ROUTE_WAIT_S = 10.0  # how long a refused batch waits for the metadata store to answer
ROUTE_RETRY_S = 0.2


async def follow(host: VirtualHost, queue: QueueRuntime) -> bool:
    """The route changed in the metadata store (on the feed, or a refused append says so):
    this gateway follows its newest version (a plain queue first scaled elsewhere joins the
    routed ones). True if it changed here."""
    stored = await host.meta.get_route(host.name, queue.name)
    if stored is None or stored.queue_id != queue.queue_id or stored == queue.route:
        return False
    if stored.by != ("key" if queue.keyed else "channel"):
        return False
    host.routed[queue.queue_id] = queue
    grew = len(stored.partitions) > queue.partitions
    if grew and host.placement is not None:
        await host.placement.refresh(queue.definition)  # the groups of the new partitions
    queue.set_route(stored)
    host.route_epoch += 1
    if grew:  # publishers elsewhere may have written there already
        queue.ready_count = await queue.ready_in_store()
    return True


async def _follow_all(host: VirtualHost, queues: Iterable[QueueRuntime]) -> bool:
    """``follow`` each queue; while the metadata store is away (a Redis restart), look again
    for up to ROUTE_WAIT_S (the publisher waits, as it would for its broker). False if it
    stayed away."""
    deadline = time.monotonic() + ROUTE_WAIT_S
    for queue in queues:
        while True:
            try:
                await follow(host, queue)
                break
            except MetaError as error:
                if time.monotonic() >= deadline:
                    log.warning("queue %r in vhost %r: a publish refused by a closed partition "
                                "is nacked: the route cannot be read (%s)", queue.name,
                                host.name, error)  # fmt: skip
                    return False
                await anyio.sleep(ROUTE_RETRY_S)
    return True


async def append_refusing_closed(
    host: VirtualHost, records: Sequence[Record], wait_durable: bool
) -> AppendResult:
    """Append; a destination the broker refused because a change on another gateway closed
    its partition goes, routed by the newest version, into a new append (the record whole:
    its key's partition changed, nothing of it was stored there). The answer's ``refused``
    keeps only what stays refused (a length limit), with indexes in ``records``."""
    result = await host.store.append(records, wait_durable=wait_durable)
    pending = list(result.refused)
    if not pending or not host.routed:
        return result
    for _ in range(REROUTES):
        touched = {host.routed[q] for _, q, _ in pending if q in host.routed}
        if not await _follow_all(host, touched):
            break  # the metadata store stayed away: what stays refused is nacked
        closed, kept = [], []
        for index, queue_id, partition in pending:
            routed = host.routed.get(queue_id)
            route = None if routed is None else routed.route
            if route is not None and route.partitions[partition].state != "open":
                closed.append((index, queue_id, partition))
            else:
                kept.append((index, queue_id, partition))
        if not closed:
            break
        indexes = sorted({index for index, _, _ in closed})
        again = reroute(host.routed, [
            records[i]._replace(destinations=tuple((q, p) for j, q, p in closed if j == i))
            for i in indexes
        ])  # fmt: skip
        retried = await host.store.append(again, wait_durable=wait_durable)
        result = result._replace(end_offset=retried.end_offset, queue_starts=None)
        pending = kept + [(indexes[i], q, p) for i, q, p in retried.refused]
    return result._replace(refused=tuple(sorted(pending)), record_offsets=())
