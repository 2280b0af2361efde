"""Where the gateways of a cluster tell each other how they use the rate limits that total
over all of them (gateway/cluster/shares.py divides them).

One hash, ``<prefix>throttle-demand``: a field per gateway holding "<Redis ms> <report>",
the report being opaque text (JSON) to this module. ``exchange`` writes the caller's field
and reads every field written within ``fresh_ms`` in one Lua script, stamped with Redis's
clock (TIME), so skewed machine clocks cannot keep a dead gateway's report alive; older
fields are deleted on the way. ``leave`` deletes the caller's field (a clean stop: the
others take its share at their next exchange instead of after ``fresh_ms``).
"""

from __future__ import annotations

from meta.redis_conn import text
from meta.redis_store import RedisMetadataStore

# KEYS: the hash; ARGV: gateway, report, fresh ms. Answers [gateway, report, ...] of the
# fresh fields (the caller's included).
_EXCHANGE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], now .. ' ' .. ARGV[2])
local all = redis.call('HGETALL', KEYS[1])
local fresh = {}
for i = 1, #all, 2 do
  local stamp, report = string.match(all[i + 1], '^(%d+) (.*)$')
  if stamp and now - tonumber(stamp) <= tonumber(ARGV[3]) then
    table.insert(fresh, all[i])
    table.insert(fresh, report)
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return fresh
"""


class ThrottleDemand:
    """The demand reports of one cluster's gateways, over the metadata store's Redis."""

    def __init__(self, store: RedisMetadataStore) -> None:
        self._conn = store._conn
        self._key = store._keys.throttle_demand
        self._script = self._conn.client.register_script(_EXCHANGE)

    async def exchange(self, gateway_id: str, report: str, fresh_ms: int) -> dict[str, str]:
        """Write this gateway's report; every fresh report by gateway (its own included).
        Raises MetadataUnavailable when Redis cannot be reached."""
        found = await self._conn.run(
            lambda: self._script(keys=[self._key], args=[gateway_id, report, fresh_ms])
        )
        items = [text(item) for item in found]
        return dict(zip(items[0::2], items[1::2], strict=True))

    async def leave(self, gateway_id: str) -> None:
        await self._conn.run(lambda: self._conn.client.hdel(self._key, gateway_id))
