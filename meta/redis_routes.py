"""Versioned routes of keyed-order queues (meta/queue_route.py) in Redis.

``<prefix>routes`` is a hash ``["vhost","queue"]`` -> ``{"queue_id": N, "route": QueueRoute}``,
as ``<prefix>gray-ends`` is for gray ends (meta.redis_gray): a record belongs to the queue
with that id only, so once the queue is deleted (or its vhost) it is no route and is never
returned; queue deletion needs no step of its own here, and the next set of the name replaces
the leftover record.

A set is a compare-and-set: in one transaction it reads (and watches) the hash and the
queue's key, compares the route stored now with the caller's ``expected`` as models (not as
JSON text: another release may spell the same route differently), then writes the record and its
``route.set`` change. A writer that changed either key meanwhile makes EXEC fail, and the
retried attempt then sees its route and refuses with RouteConflict.
"""

from __future__ import annotations

import json

from meta.change_feed import change
from meta.errors import queue_not_found, route_conflict
from meta.models import QueueDef
from meta.queue_route import QueueRoute
from meta.redis_base import RedisStoreBase
from meta.redis_topology import TopologyView
from meta.serialization import dump, key_of, load, loads

ROUTES_KEY = "routes"  # after the store's prefix


class QueueRoutesMixin(RedisStoreBase):
    @property
    def _routes_key(self) -> str:
        return self._keys.prefix + ROUTES_KEY

    async def set_route(self, route: QueueRoute, expected: QueueRoute | None) -> None:
        async def body(view: TopologyView) -> None:
            definition = await view.tx.get(self._keys.queue(route.vhost, route.queue))
            if definition is None or loads(QueueDef, definition).queue_id != route.queue_id:
                raise queue_not_found(route.vhost, route.queue)
            field = key_of(route.vhost, route.queue)
            record = await view.tx.hget(self._routes_key, field)
            current = None if record is None else _belonging(record, definition)
            if current != expected:
                version = None if current is None else current.version
                raise route_conflict(route.vhost, route.queue, version)
            stored = {"queue_id": route.queue_id, "route": dump(route)}
            view.tx.write("HSET", self._routes_key, field, json.dumps(stored, sort_keys=True))
            view.tx.publish([change("route.set", route)])

        await self._transact(body)

    async def get_route(self, vhost: str, queue: str) -> QueueRoute | None:
        async def read() -> QueueRoute | None:
            async with self._conn.client.pipeline(transaction=True) as pipe:
                pipe.hget(self._routes_key, key_of(vhost, queue))
                pipe.get(self._keys.queue(vhost, queue))
                record, definition = await pipe.execute()
            return None if record is None else _belonging(record, definition)

        return await self._read(read)


def _belonging(record: str | bytes, queue: str | bytes | None) -> QueueRoute | None:
    """The route in ``record`` if it was set for ``queue`` (its definition now), else None."""
    stored = json.loads(record)
    if queue is None or loads(QueueDef, queue).queue_id != stored["queue_id"]:
        return None
    return load(QueueRoute, stored["route"])
