"""Which broker group holds each partition of each queue, on a gateway of a cluster with
several groups (docs/cluster.md, "Placement").

The route table lives in the metadata store (meta.cluster.ClusterRegistry.place_queue): a
queue's partitions are placed once, on the live groups holding the fewest partitions, and
stay there until the queue is deleted. This is the gateway's cache of it, keyed by queue id,
which is what storage.clients.routed.RoutedStore asks (``placement(queue_id)``) on every call.

A queue is placed before its store queue is created (``place``, from the vhost when it
attaches a queue: declared here, declared elsewhere and heard of on the change feed, or
loaded at start). ``place_queue`` is idempotent, so whichever gateway comes first decides and
every other one gets the same answer. ``placement.set`` changes on the feed keep the cache
current for queues attached here.

Groups can be added while the gateway runs (gateway/cluster/groups.py: ``add_group``); a
route naming a group this gateway has no store for yet waits for it (``discover``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence

from meta.change_feed import Change
from meta.cluster import ClusterRegistry
from meta.errors import MetaError
from meta.models import QueueDef

log = logging.getLogger("mqgw.cluster")


class QueuePlacement:
    def __init__(self, meta: ClusterRegistry, groups: Sequence[str]) -> None:
        self.meta = meta
        self.groups = sorted(groups)  # the groups this gateway has a store for
        self.live: Callable[[], list[str]] = lambda: self.groups  # set by the owner
        # Set by the owner: wait (bounded) for a store for these groups, when they are live.
        self.discover: Callable[[Collection[str]], Awaitable[None]] | None = None
        self._by_id: dict[int, list[str]] = {}
        self._ids: dict[tuple[str, str], int] = {}  # (vhost, name) -> queue id, attached here
        self._stored: dict[int, list[str]] = {}  # queue id -> groups whose store had it at start

    def add_group(self, group: str) -> None:
        """A group registered after start, now with a store here."""
        if group not in self.groups:
            self.groups = sorted([*self.groups, group])

    def note_stored(self, group: str, queue_ids: Iterable[int]) -> None:
        """At start: the queues ``group``'s store holds. A queue stored before the cluster
        had several groups has no route yet; it is placed where its messages are."""
        for queue_id in queue_ids:
            self._stored.setdefault(queue_id, []).append(group)

    def __call__(self, queue_id: int) -> list[str] | None:
        """The group of each partition of the queue; None if it is not placed (yet)."""
        return self._by_id.get(queue_id)

    async def place(self, definition: QueueDef, pins: Sequence[str] = ()) -> None:
        """Place the queue (or read where it was placed) before its store queue is made;
        ``pins``: only on these groups (the live ones among them first)."""
        if definition.queue_id in self._by_id:
            return
        stored = self._stored.get(definition.queue_id)
        live = self.usable(pins)
        try:
            route = await self.meta.place_queue(
                definition.vhost, definition.name, definition.partitions, stored or live
            )
        except MetaError as error:
            if error.reply_code != 404:
                raise
            return  # deleted meanwhile: its deletion follows on the feed
        unknown = sorted(set(route) - set(self.groups))
        if unknown and self.discover is not None:  # placed by a gateway that saw it first
            await self.discover(unknown)
            unknown = sorted(set(route) - set(self.groups))
        if unknown:
            log.warning("queue %r in vhost %r is placed on broker group(s) %s, not connected "
                        "here (down?): unavailable until connected", definition.name,
                        definition.vhost, ", ".join(unknown))  # fmt: skip
        self._by_id[definition.queue_id] = route
        self._stored.pop(definition.queue_id, None)
        self._ids[(definition.vhost, definition.name)] = definition.queue_id

    def usable(self, pins: Sequence[str] = ()) -> list[str]:
        """Groups to place on: the live ones (all this gateway knows if none is), among
        ``pins`` when the queue is pinned (its pins themselves if none of them is live)."""
        live = [g for g in self.live() if g in self.groups] or self.groups
        if not pins:
            return live
        return [g for g in live if g in pins] or list(pins)

    def changed(self, change: Change) -> None:
        """A ``placement.set`` from the feed (this gateway's own too)."""
        queue_id = self._ids.get((change.vhost, change.name))
        route = (change.document or {}).get("partitions")
        if queue_id is None or not isinstance(route, list):
            return  # not attached here: placed (read from Redis) when it is
        known = self._by_id.get(queue_id)
        placed = [str(group) for group in route]
        if (change.document or {}).get("repointed") and known is not None:
            self._by_id[queue_id] = placed  # a retired group's removed partitions moved
            return
        if known is not None and placed[: len(known)] != known:
            return  # another incarnation of the name (deleted and declared again)
        if known is None or len(placed) > len(known):  # placed, or grew (a rescale)
            self._by_id[queue_id] = placed

    async def extend(self, definition: QueueDef, groups: Sequence[str]) -> list[str]:
        """A keyed-order queue grows: ``groups`` for every partition (the placed ones kept);
        the placement as the metadata store holds it after (the first writer's)."""
        placed = await self.meta.extend_placement(definition.vhost, definition.name, groups)
        await self._grown(definition, placed)
        return placed

    async def refresh(self, definition: QueueDef) -> None:
        """Read the queue's placement again: it grew on another gateway."""
        placed = await self.meta.queue_placement(definition.vhost, definition.name)
        if placed is not None:
            await self._grown(definition, placed)

    async def _grown(self, definition: QueueDef, placed: list[str]) -> None:
        unknown = sorted(set(placed) - set(self.groups))
        if unknown and self.discover is not None:  # a group added since this gateway started
            await self.discover(unknown)
        known = self._by_id.get(definition.queue_id)
        if known is None or len(placed) > len(known):
            self._by_id[definition.queue_id] = placed

    async def repoint(self, definition: QueueDef, partitions: dict[int, str]) -> None:
        placed = await self.meta.repoint_placement(definition.vhost, definition.name, partitions)
        self._by_id[definition.queue_id] = placed

    def forget(self, definition: QueueDef) -> None:
        """The queue was deleted (its store data first, while its placement was known)."""
        self._by_id.pop(definition.queue_id, None)
        key = (definition.vhost, definition.name)
        if self._ids.get(key) == definition.queue_id:
            del self._ids[key]
