"""The cluster's one group move job (a drain or a rebalance, gateway/vhost/group_moves.py),
kept in Redis so that another gateway resumes it when the one running it dies.

Two keys: ``<prefix>move-job``, the job's record (JSON, opaque here), and
``<prefix>move-job-lease``, the gateway running it, with a TTL that gateway renews. Only the
lease's holder may write the record (checked in the same script), so a gateway that was
paused past its lease and wakes up cannot overwrite the progress of the one that took over.
"""

from __future__ import annotations

from meta.redis_conn import text
from meta.redis_store import RedisMetadataStore

# KEYS: the lease; ARGV: owner, ttl ms. 1 when the caller holds the lease now.
_CLAIM = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

# KEYS: the lease, the record; ARGV: owner, record. 1 when written.
_SAVE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""

# KEYS: the lease; ARGV: owner.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""


class SharedMoveJob:
    """One gateway's hold on the cluster's move job record."""

    def __init__(self, store: RedisMetadataStore, owner: str, ttl_ms: int) -> None:
        self.owner = owner
        self._conn = store._conn
        self._ttl_ms = ttl_ms
        self._lease = store._keys.move_job_lease
        self._record = store._keys.move_job
        client = self._conn.client
        self._claim = client.register_script(_CLAIM)
        self._save = client.register_script(_SAVE)
        self._release = client.register_script(_RELEASE)

    async def claim(self) -> bool:
        """Take the job's lease if nobody holds it, or renew it; False: another gateway
        holds it. Raises MetadataUnavailable when Redis cannot be reached."""
        keys, args = [self._lease], [self.owner, str(self._ttl_ms)]
        return bool(await self._conn.run(lambda: self._claim(keys=keys, args=args)))

    async def save(self, record: str) -> bool:
        """Write the record; False (nothing written) unless this gateway holds the lease."""
        keys, args = [self._lease, self._record], [self.owner, record]
        return bool(await self._conn.run(lambda: self._save(keys=keys, args=args)))

    async def load(self) -> str | None:
        found = await self._conn.run(lambda: self._conn.client.get(self._record))
        return None if found is None else text(found)

    async def release(self) -> None:
        keys, args = [self._lease], [self.owner]
        await self._conn.run(lambda: self._release(keys=keys, args=args))
