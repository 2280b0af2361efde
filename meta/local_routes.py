"""The embedded store's versioned routes of keyed-order queues (meta/queue_route.py), apart
from meta/local_store.py, which calls it, persists what ``dump`` returns under the key
"routes" of metadata.json and publishes the changes.

A route belongs to the queue it was set for (its ``queue_id``): deleting the queue, or its
vhost, drops it (``drop``), and a route whose queue is not the one now under that name is
none, so a transient queue's route left in the file is skipped when it is read back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from meta.errors import queue_not_found, route_conflict
from meta.models import QueueDef
from meta.queue_route import QueueRoute
from meta.serialization import dump, load
from meta.state import MetadataState


class LocalRoutes:
    """The routes by (vhost, queue), checked against the queues of ``state``."""

    def __init__(self, state: MetadataState) -> None:
        self._state = state
        self._routes: dict[tuple[str, str], QueueRoute] = {}

    def get(self, vhost: str, queue: str) -> QueueRoute | None:
        route = self._routes.get((vhost, queue))
        if route is None or not self._belongs(route):
            return None
        return route

    def compare_and_set(self, route: QueueRoute, expected: QueueRoute | None) -> None:
        """Store ``route`` if the one stored now equals ``expected`` (MetadataStore.set_route);
        synchronous, so nothing else runs between the compare and the set."""
        if not self._belongs(route):
            raise queue_not_found(route.vhost, route.queue)
        current = self.get(route.vhost, route.queue)
        if current != expected:
            version = None if current is None else current.version
            raise route_conflict(route.vhost, route.queue, version)
        self._routes[(route.vhost, route.queue)] = route

    def drop(self, queue: QueueDef) -> None:
        """A deleted queue loses its route (no change of its own: queue.deleted says it)."""
        self._routes.pop((queue.vhost, queue.name), None)

    def dump(self) -> list[dict[str, Any]]:
        return [dump(self._routes[key]) for key in sorted(self._routes)]

    def load(self, documents: Iterable[dict[str, Any]]) -> None:
        """Read back what ``dump`` wrote, once the queues are restored."""
        for data in documents:
            route = load(QueueRoute, data)
            if self._belongs(route):  # not a transient queue's, gone with the restart
                self._routes[(route.vhost, route.queue)] = route

    def _belongs(self, route: QueueRoute) -> bool:
        """Whether the queue now under the route's name is the one it was set for."""
        vhost = self._state.vhosts.get(route.vhost)
        queue = None if vhost is None else vhost.queues.get(route.queue)
        return queue is not None and queue.queue_id == route.queue_id
