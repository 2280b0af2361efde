"""Routes of plain queues that scale (``by: "channel"``, docs/elastic-queues.md), after
DeFiBus's rules: growing is **read-first**, shrinking and moving are **write-first**.

A plain queue's publishers keep one partition per channel (RabbitMQ's per-channel FIFO);
its route says which partitions they may write to (``open``) and which are still read:

- **grow**: version v+1 adds partitions ``opening``: read (a delivering gateway takes
  them) but not written; once they are held they turn ``open`` (``opened``), and publishers
  write there from then on;
- **shrink**: v+1 turns the highest open partitions ``closing``: publishers stop writing
  there at once; a command record is appended to each (``draining``), and once every
  message before it is settled the partition is ``removed`` (meta/queue_route.py's
  ``closed``/``removed``, as for keyed queues);
- **move**: v+1 adds a partition ``opening`` on another broker group that moves ``after``
  partitions; when it opens they close in the same write (writes go there at once).

A channel whose partition closed goes to ``successor(route, p)``: the same partition from
every gateway and for every later publish, so its messages after the change stay in order.
One change at a time, versions consecutive (a compare-and-set in the metadata store). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from meta.queue_route import (
    MAX_ROUTE_PARTITIONS,
    QueueRoute,
    RoutePartition,
    RouteRefused,
    RouteVersion,
)


def channel_route(
    vhost: str, queue: str, queue_id: int, partitions: int, groups: Sequence[str] = (),
    at: str = "",
) -> QueueRoute:  # fmt: skip
    """Version 1: the queue as it was declared, every partition open."""
    parts = tuple(RoutePartition(partition=i, group=groups[i] if i < len(groups) else "")
                  for i in range(partitions))  # fmt: skip
    return QueueRoute(
        vhost=vhost, queue=queue, queue_id=queue_id, by="channel", logical=0,
        versions=(RouteVersion(version=1, ranges=(), at=at),), partitions=parts,
    )  # fmt: skip


def grow(route: QueueRoute, count: int, groups: Sequence[str], when: str = "") -> QueueRoute:
    """``count`` new partitions (``groups``: each one's broker group), opening."""
    _idle(route)
    if count < 1:
        raise RouteRefused("a grow adds at least one partition")
    version = route.version + 1
    first = _room(route, count)
    added = tuple(
        RoutePartition(
            partition=first + i,
            group=groups[i] if i < len(groups) else "",
            state="opening",
            opened_in=version,
        )
        for i in range(count)
    )
    total = len(route.open_partitions()) + count
    return _version(route, (*route.partitions, *added), f"grow to {total}", when)


def shrink(route: QueueRoute, count: int, when: str = "") -> QueueRoute:
    """Keep the ``count`` lowest open partitions; the others close."""
    _idle(route)
    open_parts = route.open_partitions()
    if not 1 <= count < len(open_parts):
        raise RouteRefused(f"a shrink keeps from 1 to {len(open_parts) - 1} of the "
                           f"{len(open_parts)} open partitions, not {count}")  # fmt: skip
    version = route.version + 1
    closing = set(open_parts[count:])
    parts = tuple(
        p.model_copy(update={"state": "closing", "closed_in": version})
        if p.partition in closing else p
        for p in route.partitions
    )  # fmt: skip
    return _version(route, parts, f"shrink to {count}", when)


def move(route: QueueRoute, partitions: Iterable[int], group: str, when: str = "") -> QueueRoute:
    """A new partition on ``group`` for each of ``partitions`` (open ones), opening; each
    old one closes when its new one opens."""
    _idle(route)
    moved = sorted(set(partitions))
    if not moved:
        raise RouteRefused(f"no partition to move to {group or 'a new partition'}")
    for p in moved:
        state = route.partition(p).state
        if state != "open":
            raise RouteRefused(f"partition {p} is {state}, not open")
    version = route.version + 1
    first = _room(route, len(moved))
    added = tuple(
        RoutePartition(
            partition=first + i, group=group, state="opening", opened_in=version, after=(p,)
        )
        for i, p in enumerate(moved)
    )
    what = f"move {','.join(map(str, moved))} to {group or 'a new partition'}"
    return _version(route, (*route.partitions, *added), what, when)


def opened(route: QueueRoute, partitions: Iterable[int]) -> QueueRoute:
    """``partitions`` (opening) are read now: publishers may write there; the partitions
    they move close in the same write."""
    parts = list(route.partitions)
    for p in partitions:
        part = route.partition(p)
        if part.state != "opening":
            raise RouteRefused(f"partition {p} is {part.state}, not opening")
        parts[p] = part.model_copy(update={"state": "open"})
        for old in part.after:
            parts[old] = parts[old].model_copy(
                update={"state": "closing", "closed_in": part.opened_in}
            )
    return route.model_copy(update={"partitions": tuple(parts)})


def successor(route: QueueRoute, partition: int) -> int:
    """Where a channel whose partition is not open any more writes: one of the open ones,
    the same for every gateway (the mover's new partition, if it moved)."""
    open_parts = route.open_partitions()
    for part in route.partitions:
        if partition in part.after and part.state == "open":
            return part.partition
    return open_parts[partition % len(open_parts)]


def _idle(route: QueueRoute) -> None:
    if route.by != "channel":
        raise RouteRefused("a keyed-order queue changes by split, merge and move (rescale)")
    reason = route.in_progress()
    if reason is not None:
        raise RouteRefused(reason)


def _room(route: QueueRoute, count: int) -> int:
    first = len(route.partitions)
    if first + count > MAX_ROUTE_PARTITIONS:
        raise RouteRefused(f"the queue has used {first} physical partitions; "
                           f"{MAX_ROUTE_PARTITIONS} is the most it may")  # fmt: skip
    return first


def _version(
    route: QueueRoute, parts: tuple[RoutePartition, ...], what: str, when: str
) -> QueueRoute:
    step = RouteVersion(version=route.version + 1, ranges=(), change=what, at=when)
    return route.model_copy(update={"versions": (*route.versions, step), "partitions": parts})
