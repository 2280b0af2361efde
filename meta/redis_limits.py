"""Vhost limits and connection counts in Redis (meta.vhost_limits has the rules).

``<prefix>vhost-limits`` is a hash vhost -> VHostLimits. The open connections of a vhost are
the set ``<prefix>v:<vhost>:conns`` of "<gateway>/<n>" ids, over every gateway: a Lua script
checks the count against the limit and adds the id in one step, so two gateways opening the
last free place at once cannot both get it. A connection's id leaves the set when it closes,
and the ids of a gateway that died go when it is reaped (``forget_connections``, called by
reap_gateway), or when a gateway of the same name starts again.
"""

from __future__ import annotations

from redis.commands.core import AsyncScript

from meta.change_feed import change
from meta.errors import vhost_not_found
from meta.models import VHostLimits
from meta.redis_base import RedisStoreBase
from meta.redis_conn import text
from meta.redis_topology import TopologyView
from meta.serialization import dumps, loads
from meta.vhost_limits import MAX_QUEUES, limit_of

# KEYS: the vhost's connection set; ARGV: connection id, limit (-1: none). 1 admitted, 0 not.
_OPEN = """
local limit = tonumber(ARGV[2])
if limit >= 0 and redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0
   and redis.call('SCARD', KEYS[1]) >= limit then
  return 0
end
redis.call('SADD', KEYS[1], ARGV[1])
return 1
"""
# KEYS: connection sets; ARGV: "<gateway>/". Removes that gateway's ids from each set.
_FORGET = """
local removed = 0
for _, key in ipairs(KEYS) do
  for _, id in ipairs(redis.call('SMEMBERS', key)) do
    if string.sub(id, 1, #ARGV[1]) == ARGV[1] then
      removed = removed + redis.call('SREM', key, id)
    end
  end
end
return removed
"""


class VHostLimitsMixin(RedisStoreBase):
    async def set_vhost_limits(self, limits: VHostLimits) -> None:
        async def body(view: TopologyView) -> None:
            if await view.vhost(limits.vhost) is None:
                raise vhost_not_found(limits.vhost)
            view.tx.write("HSET", self._keys.vhost_limits, limits.vhost, dumps(limits))
            view.tx.publish([change("vhost_limits.set", limits)])

        await self._transact(body)

    async def get_vhost_limits(self, vhost: str) -> VHostLimits | None:
        found = await self._read(lambda: self._conn.client.hget(self._keys.vhost_limits, vhost))
        return None if found is None else loads(VHostLimits, found)

    async def list_vhost_limits(self) -> list[VHostLimits]:
        texts = await self._read(lambda: self._conn.client.hvals(self._keys.vhost_limits))
        return sorted((loads(VHostLimits, t) for t in texts), key=lambda v: v.vhost)

    async def open_connection(
        self, vhost: str, connection_id: str, max_connections: int | None
    ) -> bool:
        script = self._limits_script("_open_connection_script", _OPEN)
        keys = [self._keys.connections(vhost)]
        args: list[str | int] = [connection_id, -1 if max_connections is None else max_connections]
        return bool(await self._read(lambda: script(keys=keys, args=args)))

    async def close_connection(self, vhost: str, connection_id: str) -> None:
        key = self._keys.connections(vhost)
        await self._read(lambda: self._conn.client.srem(key, connection_id))

    async def count_connections(self, vhost: str) -> int:
        key = self._keys.connections(vhost)
        return int(await self._read(lambda: self._conn.client.scard(key)))

    async def forget_connections(self, gateway_id: str) -> None:
        script = self._limits_script("_forget_connections_script", _FORGET)

        async def forget() -> None:
            vhosts = [text(v) for v in await self._conn.client.hkeys(self._keys.vhosts)]
            keys = [self._keys.connections(v) for v in vhosts]
            if keys:
                await script(keys=keys, args=[gateway_id + "/"])

        await self._read(forget)

    def _limits_script(self, attribute: str, source: str) -> AsyncScript:
        """A Lua script registered on first use (the base class's __init__ is shared)."""
        script: AsyncScript | None = getattr(self, attribute, None)
        if script is None:
            script = self._conn.client.register_script(source)
            setattr(self, attribute, script)
        return script

    async def _queue_limit(self, view: TopologyView, vhost: str) -> tuple[int, int] | None:
        """(max-queues, queues now) for a declare that creates a queue, read in its
        transaction: the limit and the queue index are watched, so two gateways racing for
        the last place cannot both commit."""
        found = await view.tx.hget(self._keys.vhost_limits, vhost)
        limit = limit_of(None if found is None else loads(VHostLimits, found), MAX_QUEUES)
        if limit is None:
            return None
        index = self._keys.queue_index(vhost)
        await view.tx.pipe.watch(index)
        return limit, int(await view.tx.pipe.scard(index))
