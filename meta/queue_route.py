"""Versioned routes of keyed-order queues (``x-mqgw-ordering: key``), after QMQ's ordered
messages (docs/ordering.md).

A key's logical partition is ``crc32(key) % L``, with L fixed at declare
(``x-mqgw-logical-partitions``). A route maps contiguous ranges of logical partitions onto
physical partitions (the store's partitions of the queue), each open one holding exactly one
range. Rescaling never changes a key's logical partition: a change appends version v+1,
whose ranges name new physical partitions, and closes the partitions it replaces:

- **closing**: v+1 is written, publishers use it at once, nothing is written to the closed
  partition any more; its command record is not yet appended;
- **draining**: the command record is at ``closed_at`` in the closed partition; the
  partitions that replace it (``after``) deliver only once it has drained: every message
  below ``closed_at`` settled. That gate is what keeps per-key order across a change;
- **removed**: drained; it is read no more, and its disk goes with the log's retention.

QMQ's constraints hold: versions strictly consecutive (a compare-and-set on the version in
the metadata store), one change at a time (none while a partition is closing or draining),
only adjacent ranges merge. Everything here is pure: the gateway applies the results
(gateway/queues/ordered.py, gateway/vhost/rescale.py).
"""

from __future__ import annotations

import itertools
import zlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

ORDERING_ARG = "x-mqgw-ordering"
ORDERING_HEADER_ARG = "x-mqgw-ordering-header"
LOGICAL_ARG = "x-mqgw-logical-partitions"
ORDERING_KEY = "ordering"  # the policy key
DEFAULT_LOGICAL = 1024
MAX_LOGICAL = 65536
MAX_ROUTE_PARTITIONS = 4096  # physical partitions a queue may ever have used
COMMAND_EXCHANGE = "\x00mqgw.route"  # a command record's exchange: no AMQP name has it

PartitionState = Literal["opening", "open", "closing", "draining", "removed"]
RouteKind = Literal["key", "channel"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RoutePartition(_Model):
    """A physical partition, from the version that opened it to its removal."""

    partition: int
    group: str = ""  # its broker group ("" on the embedded node)
    state: PartitionState = "open"
    opened_in: int = 1
    # Keyed: the partitions it replaced (it delivers once they drained). Channel: the
    # partitions it moves (they close when it opens: meta/channel_route.py).
    after: tuple[int, ...] = ()
    closed_in: int | None = None
    closed_at: int | None = None  # the offset of its command record


class RouteRange(_Model):
    start: int  # the first logical partition
    end: int  # past the last
    partition: int


class RouteVersion(_Model):
    version: int
    ranges: tuple[RouteRange, ...]
    change: str = "declare"
    at: str = ""  # ISO 8601, UTC


class QueueRoute(_Model):
    vhost: str
    queue: str
    queue_id: int
    # "key": a keyed-order queue's (ranges of logical partitions); "channel": a plain queue
    # that was scaled, whose publishers keep a partition per channel (meta/channel_route.py).
    by: RouteKind = "key"
    logical: int = DEFAULT_LOGICAL
    header: str | None = None  # the key's header; None: the routing key
    versions: tuple[RouteVersion, ...]  # oldest first, strictly consecutive
    partitions: tuple[RoutePartition, ...] = Field(default=())  # indexed by number
    # Open partitions an operator asked for (rescale --partitions N): the gateways take one
    # step at a time towards it, across restarts; None once reached.
    target: int | None = None

    @property
    def version(self) -> int:
        return self.versions[-1].version

    @property
    def ranges(self) -> tuple[RouteRange, ...]:
        return self.versions[-1].ranges

    def partition(self, number: int) -> RoutePartition:
        if not 0 <= number < len(self.partitions):
            raise RouteRefused(f"unknown partition {number}")
        return self.partitions[number]

    def open_partitions(self) -> list[int]:
        if self.by == "channel":
            return [p.partition for p in self.partitions if p.state == "open"]
        return [r.partition for r in self.ranges]

    def read_partitions(self) -> list[int]:
        """Partitions that may still hold messages to deliver (not removed)."""
        return [p.partition for p in self.partitions if p.state != "removed"]

    def partition_of(self, logical: int) -> int:
        """The physical partition of a logical one in the newest version."""
        for r in self.ranges:
            if r.start <= logical < r.end:
                return r.partition
        raise ValueError(f"logical partition {logical} is outside the route")

    def in_progress(self) -> str | None:
        """Why no change may start now (one at a time), or None."""
        for p in self.partitions:
            if p.state in ("opening", "closing", "draining"):
                version = p.opened_in if p.state == "opening" else p.closed_in
                return (
                    f"a change is in progress: version {version} is not complete "
                    f"(partition {p.partition} is {p.state})"
                )
        return None


class RouteRefused(ValueError):
    """A change QMQ's constraints refuse (the admin API's 409 with this reason)."""


def logical_of(key: bytes, logical: int) -> int:
    """A key's logical partition: stable across processes and releases."""
    return zlib.crc32(key) % logical


def initial_route(
    vhost: str, queue: str, queue_id: int, partitions: int, logical: int = DEFAULT_LOGICAL,
    header: str | None = None, groups: tuple[str, ...] = (), at: str = "",
) -> QueueRoute:  # fmt: skip
    """Version 1: ``partitions`` even ranges (``groups``: each partition's broker group)."""
    if not 1 <= partitions <= logical:
        raise RouteRefused(f"{partitions} partitions need at least as many logical ones")
    bounds = [logical * i // partitions for i in range(partitions + 1)]
    ranges = tuple(RouteRange(start=bounds[i], end=bounds[i + 1], partition=i)
                   for i in range(partitions))  # fmt: skip
    parts = tuple(RoutePartition(partition=i, group=groups[i] if i < len(groups) else "")
                  for i in range(partitions))  # fmt: skip
    return QueueRoute(
        vhost=vhost, queue=queue, queue_id=queue_id, logical=logical, header=header,
        versions=(RouteVersion(version=1, ranges=ranges, at=at),), partitions=parts,
    )  # fmt: skip


# -- changes: each returns version v+1 with the replaced partitions closing ----------------


def split(route: QueueRoute, partition: int, at: int | None = None, when: str = "") -> QueueRoute:
    """``partition``'s range in two new partitions, cut before logical partition ``at``
    (default: its middle); both stay on its broker group."""
    old = _range_of(route, partition)
    if old.end - old.start < 2:
        raise RouteRefused(f"partition {partition} holds one logical partition: no split")
    cut = (old.start + old.end) // 2 if at is None else at
    if not old.start < cut < old.end:
        raise RouteRefused(
            f"split point {cut} is not inside partition {partition}'s range "
            f"[{old.start}, {old.end})"
        )
    group = route.partition(partition).group
    return _change(route, [partition], [(old.start, cut, group), (cut, old.end, group)],
                   f"split {partition} at {cut}", when)  # fmt: skip


def merge(route: QueueRoute, first: int, second: int, when: str = "") -> QueueRoute:
    """Two partitions holding adjacent ranges into one new partition (on the lower's group)."""
    if first == second:
        raise RouteRefused("merge needs two different partitions")
    a, b = sorted((_range_of(route, first), _range_of(route, second)), key=lambda r: r.start)
    if a.end != b.start:
        raise RouteRefused(
            f"partitions {first} and {second} hold ranges that are not contiguous "
            f"([{a.start}, {a.end}) and [{b.start}, {b.end})): only adjacent ranges merge"
        )
    group = route.partition(a.partition).group
    return _change(route, [a.partition, b.partition], [(a.start, b.end, group)],
                   f"merge {first},{second}", when)  # fmt: skip


def move(route: QueueRoute, partition: int, group: str, when: str = "") -> QueueRoute:
    """``partition``'s range to a new partition on ``group`` (the embedded node: "")."""
    old = _range_of(route, partition)
    return _change(route, [partition], [(old.start, old.end, group)],
                   f"move {partition} to {group or 'a new partition'}", when)  # fmt: skip


def next_step(route: QueueRoute, target: int) -> tuple[str, tuple[int, ...]] | None:
    """One step towards ``target`` open partitions: ("split", (p,)) of the widest range, or
    ("merge", (p, q)) of the adjacent pair covering the fewest logical partitions; None
    once there."""
    if not 1 <= target <= route.logical:
        raise RouteRefused(f"partitions must be from 1 to {route.logical}, not {target}")
    ranges = sorted(route.ranges, key=lambda r: r.start)
    if len(ranges) < target:
        widest = max(ranges, key=lambda r: (r.end - r.start, -r.start))
        return "split", (widest.partition,)
    if len(ranges) > target:
        pairs = itertools.pairwise(ranges)
        a, b = min(pairs, key=lambda ab: (ab[1].end - ab[0].start, ab[0].start))
        return "merge", (a.partition, b.partition)
    return None


def closed(route: QueueRoute, partition: int, offset: int) -> QueueRoute:
    """The command record of closing ``partition`` is at ``offset``: it drains now."""
    part = route.partition(partition)
    if part.state != "closing":
        raise RouteRefused(f"partition {partition} is {part.state}, not closing")
    return _with(route, part.model_copy(update={"state": "draining", "closed_at": offset}))


def removed(route: QueueRoute, partition: int) -> QueueRoute:
    """``partition`` drained (every group passed its command record)."""
    part = route.partition(partition)
    if part.state != "draining":
        raise RouteRefused(f"partition {partition} is {part.state}, not draining")
    return _with(route, part.model_copy(update={"state": "removed"}))


def gate_open(route: QueueRoute, partition: int) -> bool:
    """Whether ``partition`` may deliver: everything it replaced has drained."""
    parts = route.partitions
    return all(parts[p].state == "removed" for p in parts[partition].after)


def _range_of(route: QueueRoute, partition: int) -> RouteRange:
    reason = route.in_progress()
    if reason is not None:
        raise RouteRefused(reason)
    route.partition(partition)  # unknown: refused
    for r in route.ranges:
        if r.partition == partition:
            return r
    raise RouteRefused(f"partition {partition} is {route.partitions[partition].state}, not open")


def _change(
    route: QueueRoute, replaced: list[int], new: list[tuple[int, int, str]], what: str,
    when: str,
) -> QueueRoute:  # fmt: skip
    version = route.version + 1
    first = len(route.partitions)
    if first + len(new) > MAX_ROUTE_PARTITIONS:
        raise RouteRefused(f"the queue has used {first} physical partitions, the most it may")
    parts = list(route.partitions)
    for p in replaced:
        parts[p] = parts[p].model_copy(update={"state": "closing", "closed_in": version})
    added = [
        RoutePartition(partition=first + i, group=group, opened_in=version,
                       after=tuple(sorted(replaced)))
        for i, (_, _, group) in enumerate(new)
    ]  # fmt: skip
    kept = [r for r in route.ranges if r.partition not in replaced]
    ranges = kept + [RouteRange(start=s, end=e, partition=first + i)
                     for i, (s, e, _) in enumerate(new)]  # fmt: skip
    ranges.sort(key=lambda r: r.start)
    step = RouteVersion(version=version, ranges=tuple(ranges), change=what, at=when)
    return route.model_copy(
        update={"versions": (*route.versions, step), "partitions": (*parts, *added)}
    )


def _with(route: QueueRoute, part: RoutePartition) -> QueueRoute:
    parts = list(route.partitions)
    parts[part.partition] = part
    return route.model_copy(update={"partitions": tuple(parts)})
