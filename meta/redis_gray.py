"""Gray release rules, and the queues whose gray release ended, in Redis
(gateway/features/gray.py applies both).

``<prefix>gray-rules`` is a hash rule name -> GrayRule. Rules are few and change rarely, so
the whole hash is the WATCH unit, as for the records of meta.redis_records. A set is a blind
HSET with its ``gray_rule.set`` change; a delete reads the rule in its transaction so that
the ``gray_rule.deleted`` change carries what was removed.

``<prefix>gray-ends`` is a hash ``["vhost","queue"]`` -> ``{"queue_id": N, "end": GrayEnd}``:
the id of the queue the end was set for (read, watched, in the set's transaction; NotFound
when there is no such queue). An end belongs to that queue only: once the queue is deleted
(or its vhost), a record whose id is not the id of the queue now under that name is no end,
and is never returned. Queue deletion thus needs no step of its own here (its
``queue.deleted`` change tells the gateways); the next set or delete of the name replaces or
removes the leftover record.
"""

from __future__ import annotations

import json

from meta.change_feed import change
from meta.errors import queue_not_found
from meta.models import GrayEnd, GrayRule, QueueDef
from meta.redis_base import RedisStoreBase
from meta.redis_topology import TopologyView
from meta.serialization import dump, dumps, key_of, load, loads, parse_key

GRAY_RULES_KEY = "gray-rules"  # after the store's prefix
GRAY_ENDS_KEY = "gray-ends"  # likewise


class GrayRulesMixin(RedisStoreBase):
    @property
    def _gray_rules_key(self) -> str:
        return self._keys.prefix + GRAY_RULES_KEY

    async def set_gray_rule(self, rule: GrayRule) -> None:
        async def body(view: TopologyView) -> None:
            view.tx.write("HSET", self._gray_rules_key, rule.name, dumps(rule))
            view.tx.publish([change("gray_rule.set", rule)])

        await self._transact(body)

    async def delete_gray_rule(self, name: str) -> bool:
        async def body(view: TopologyView) -> bool:
            text = await view.tx.hget(self._gray_rules_key, name)
            if text is None:
                return False
            view.tx.write("HDEL", self._gray_rules_key, name)
            view.tx.publish([change("gray_rule.deleted", loads(GrayRule, text))])
            return True

        return await self._transact(body)

    async def get_gray_rule(self, name: str) -> GrayRule | None:
        key = self._gray_rules_key
        text = await self._read(lambda: self._conn.client.hget(key, name))
        return None if text is None else loads(GrayRule, text)

    async def list_gray_rules(self) -> list[GrayRule]:
        key = self._gray_rules_key
        texts = await self._read(lambda: self._conn.client.hvals(key))
        return sorted((loads(GrayRule, t) for t in texts), key=lambda r: r.name)

    # --- queues whose gray release ended ---------------------------------------------------

    @property
    def _gray_ends_key(self) -> str:
        return self._keys.prefix + GRAY_ENDS_KEY

    async def set_gray_end(self, end: GrayEnd) -> None:
        async def body(view: TopologyView) -> None:
            queue = await view.tx.get(self._keys.queue(end.vhost, end.queue))
            if queue is None:
                raise queue_not_found(end.vhost, end.queue)
            record = {"queue_id": loads(QueueDef, queue).queue_id, "end": dump(end)}
            field = key_of(end.vhost, end.queue)
            view.tx.write("HSET", self._gray_ends_key, field, json.dumps(record, sort_keys=True))
            view.tx.publish([change("gray_end.set", end)])

        await self._transact(body)

    async def delete_gray_end(self, vhost: str, queue: str) -> bool:
        async def body(view: TopologyView) -> bool:
            field = key_of(vhost, queue)
            record = await view.tx.hget(self._gray_ends_key, field)
            if record is None:
                return False
            view.tx.write("HDEL", self._gray_ends_key, field)  # a leftover goes too
            end = _belonging(record, await view.tx.get(self._keys.queue(vhost, queue)))
            if end is None:
                return False
            view.tx.publish([change("gray_end.deleted", end)])
            return True

        return await self._transact(body)

    async def get_gray_end(self, vhost: str, queue: str) -> GrayEnd | None:
        async def read() -> GrayEnd | None:
            async with self._conn.client.pipeline(transaction=True) as pipe:
                pipe.hget(self._gray_ends_key, key_of(vhost, queue))
                pipe.get(self._keys.queue(vhost, queue))
                record, definition = await pipe.execute()
            return None if record is None else _belonging(record, definition)

        return await self._read(read)

    async def list_gray_ends(self) -> list[GrayEnd]:
        async def read() -> list[GrayEnd]:
            records = await self._conn.client.hgetall(self._gray_ends_key)
            if not records:
                return []
            fields = sorted(records)
            keys = [self._keys.queue(*parse_key(field)) for field in fields]
            definitions = await self._conn.client.mget(keys)
            ends = (
                _belonging(records[field], definition)
                for field, definition in zip(fields, definitions, strict=True)
            )
            return sorted((e for e in ends if e is not None), key=lambda e: (e.vhost, e.queue))

        return await self._read(read)


def _belonging(record: str | bytes, queue: str | bytes | None) -> GrayEnd | None:
    """The end in ``record`` if it was set for ``queue`` (its definition now), else None."""
    stored = json.loads(record)
    if queue is None or loads(QueueDef, queue).queue_id != stored["queue_id"]:
        return None
    return load(GrayEnd, stored["end"])
