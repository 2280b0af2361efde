"""What every part of the Redis store shares: the connection, keys, options, and the two
ways to call Redis (a read, or an optimistic transaction), both bounded and retried by
RedisConnection.run, both after the one-time bootstrap of a fresh Redis."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from meta import checks
from meta.change_feed import change
from meta.models import BUILTIN_EXCHANGE_TYPES, DEFAULT_VHOST, Permission, User, VHost
from meta.password import hash_password
from meta.redis_conn import DEFAULT_UNAVAILABLE_TIMEOUT_S, RedisConnection, require_asyncio
from meta.redis_keys import DEFAULT_PREFIX, RedisKeys
from meta.redis_topology import TopologyView, Tx
from meta.serialization import dumps, key_of

T = TypeVar("T")
DEFAULT_FEED_MAX_LEN = 100_000

# Lists as one atomic read: the index set, then each member's value (GET) or values (HVALS).
LIST_SCRIPT = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return false end
local found = {}
for _, name in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if ARGV[3] == 'get' then
    local value = redis.call('GET', ARGV[2] .. name)
    if value then found[#found + 1] = value end
  else
    for _, value in ipairs(redis.call('HVALS', ARGV[2] .. name)) do found[#found + 1] = value end
  end
end
return found
"""


class RedisStoreBase:
    def __init__(
        self,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        unavailable_timeout_s: float = DEFAULT_UNAVAILABLE_TIMEOUT_S,
        exchange_types: Iterable[str] = BUILTIN_EXCHANGE_TYPES,
        max_topic_hash_wildcards: int | None = checks.MAX_TOPIC_HASH_WILDCARDS,
        default_user: bool = True,
        change_feed_max_len: int = DEFAULT_FEED_MAX_LEN,
    ) -> None:
        require_asyncio()
        self._conn = RedisConnection(url, unavailable_timeout_s)
        self._keys = RedisKeys(prefix)
        self._exchange_types = frozenset(exchange_types)
        self._max_wildcards = max_topic_hash_wildcards
        self._default_user = default_user
        self._feed_max_len = change_feed_max_len
        self._bootstrapped = False
        self._list_script = self._conn.client.register_script(LIST_SCRIPT)

    @property
    def transaction_conflicts(self) -> int:
        """Transactions retried because another writer changed what they read (a metric)."""
        return self._conn.conflicts

    @property
    def unreplicated_writes(self) -> int:
        """Changes that stood with no Redis replica, on the sentinels' word that none could
        be promoted (meta/redis_replicated.py; a metric)."""
        return 0 if self._conn.replicated is None else self._conn.replicated.unreplicated

    async def _transact(self, body: Callable[[TopologyView], Awaitable[T]]) -> T:
        """``body`` reads through the view (watching), decides, queues writes; then EXEC.
        A WatchError anywhere starts a fresh attempt (a new view) via RedisConnection.run.
        With Sentinel, answered only once a failover cannot lose what it read and wrote."""

        replicated = self._conn.replicated
        written = None if replicated is None else self._keys.written(uuid.uuid4().hex)

        async def attempt() -> T:
            await self._bootstrap()
            async with self._conn.client.pipeline(transaction=True) as pipe:
                view = self._view(Tx(pipe, self._keys, self._feed_max_len, written))
                result = await body(view)
                await view.tx.commit()
                return result

        result = await self._conn.run(attempt)
        if replicated is not None and written is not None:
            await self._conn.run(lambda: replicated.confirm(written))
        return result

    async def _read(self, operation: Callable[[], Awaitable[T]]) -> T:
        async def attempt() -> T:
            await self._bootstrap()
            return await operation()

        return await self._conn.run(attempt)

    def _view(self, tx: Tx) -> TopologyView:
        return TopologyView(tx, self._exchange_types, self._max_wildcards)

    async def _bootstrap(self) -> None:
        """Vhost "/" (and guest) on a fresh Redis, once: racing gateways WATCH the marker
        and all but one retry and find it set."""
        if self._bootstrapped:
            return
        async with self._conn.client.pipeline(transaction=True) as pipe:
            tx = Tx(pipe, self._keys, self._feed_max_len)
            if await tx.get(self._keys.bootstrapped) is None:
                view = self._view(tx)
                if await view.vhost(DEFAULT_VHOST) is None:
                    view.create_vhost(VHost(name=DEFAULT_VHOST))
                if self._default_user:
                    guest = User(
                        name="guest", password_hash=hash_password("guest"), tags=("administrator",)
                    )
                    self._write_user(tx, guest)
                    self._write_permission(tx, Permission(user="guest", vhost=DEFAULT_VHOST))
                tx.write("SET", self._keys.bootstrapped, "1")
                await tx.commit()
        self._bootstrapped = True

    def _write_user(self, tx: Tx, user: User) -> None:
        tx.write("HSET", self._keys.users, user.name, dumps(user))
        tx.publish([change("user.put", user)])

    def _write_permission(self, tx: Tx, permission: Permission) -> None:
        field = key_of(permission.user, permission.vhost)
        tx.write("HSET", self._keys.permissions, field, dumps(permission))
        tx.publish([change("permission.set", permission)])
