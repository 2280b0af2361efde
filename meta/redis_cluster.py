"""meta.cluster.ClusterRegistry on Redis: gateway leases, broker heartbeats, placement.

Leases are keys with a TTL (PX), so Redis's clock decides when one lapses; the set
``<prefix>gateways`` remembers every registered gateway so a lapsed one (key gone) can
still be found and reaped. A gateway's exclusive queues are found through the owner sets
``<prefix>owner:<gateway_id>/<n>`` (one per connection, kept by declare and delete), by
SCAN: reaping is rare, and per-connection sets keep closing a connection cheap.

Broker heartbeats and delivery leases go straight to Redis, without the first-use bootstrap
of vhost "/" and guest: a broker is no metadata client, and must not be the one to decide
(with its own defaults) what a fresh cluster's first user is.

Placement: ``<vhost>:route:<queue>`` holds the group of each partition, written once in a
transaction that watches it (and the queue), so concurrent callers get the same answer.
``<prefix>placement-load`` counts partitions per group; it is read without WATCH (a
racing placement may pick the same "emptiest" group, which only skews the spread
slightly) and kept by HINCRBY, also when a queue is deleted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from meta.change_feed import Change
from meta.cluster import BrokerInfo, spread_partitions
from meta.errors import queue_not_found
from meta.models import BindingDef, Deletions, ExchangeDef, QueueDef
from meta.redis_base import RedisStoreBase
from meta.redis_conn import text
from meta.redis_topology import TopologyView
from meta.serialization import key_of, parse_key

# KEYS: lease, token counter; ARGV: owner, ttl ms. The value is "<owner> <token>".
_HOLD_LEASE = """
local held = redis.call('GET', KEYS[1])
if held then
  local owner, token = string.match(held, '^(.*) (%d+)$')
  if owner == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return token
  end
  return false
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. token, 'PX', ARGV[2])
return tostring(token)
"""
_DROP_LEASE = """
local held = redis.call('GET', KEYS[1])
if held and string.match(held, '^(.*) %d+$') == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
return 1
"""


class RedisClusterRegistry(RedisStoreBase):
    async def delete_exclusive_queues(self, owner: str) -> Deletions:
        raise NotImplementedError  # RedisMetadataStore's, used by reap_gateway

    # --- gateway leases ---

    async def register_gateway(self, gateway_id: str, ttl_ms: int) -> None:
        async def register() -> None:
            async with self._conn.client.pipeline(transaction=True) as pipe:
                pipe.set(self._keys.gateway_lease(gateway_id), "1", px=ttl_ms)
                pipe.sadd(self._keys.gateways, gateway_id)
                await pipe.execute()

        await self._read(register)

    async def renew_gateway(self, gateway_id: str, ttl_ms: int) -> bool:
        key = self._keys.gateway_lease(gateway_id)
        renewed = await self._read(lambda: self._conn.client.set(key, "1", px=ttl_ms, xx=True))
        return bool(renewed)

    async def _gateways(self) -> dict[str, bool]:
        """Every registered gateway id and whether its lease is live."""

        async def read() -> dict[str, bool]:
            ids = sorted(text(g) for g in await self._conn.client.smembers(self._keys.gateways))
            async with self._conn.client.pipeline(transaction=False) as pipe:
                for gateway_id in ids:
                    pipe.exists(self._keys.gateway_lease(gateway_id))
                live = await pipe.execute()
            return {gateway_id: bool(n) for gateway_id, n in zip(ids, live, strict=True)}

        return await self._read(read)

    async def _exists(self, key: str) -> bool:
        return bool(await self._conn.client.exists(key))

    async def live_gateways(self) -> list[str]:
        return [g for g, live in (await self._gateways()).items() if live]

    async def lapsed_gateways(self) -> list[str]:
        return [g for g, live in (await self._gateways()).items() if not live]

    async def reap_gateway(self, gateway_id: str, *, force: bool = False) -> Deletions:
        lease = self._keys.gateway_lease(gateway_id)
        if not force and await self._read(lambda: self._exists(lease)):
            return Deletions()
        pattern = self._keys.owner_pattern(gateway_id)

        async def owners() -> list[str]:
            found = [k async for k in self._conn.client.scan_iter(match=pattern, count=1000)]
            return [k.removeprefix(self._keys.owner("")) for k in found]

        exchanges: list[ExchangeDef] = []
        queues: list[QueueDef] = []
        bindings: list[BindingDef] = []
        for owner in await self._read(owners):
            deleted = await self.delete_exclusive_queues(owner)
            exchanges += deleted.exchanges
            queues += deleted.queues
            bindings += deleted.bindings

        async def forget() -> None:
            async with self._conn.client.pipeline(transaction=True) as pipe:
                pipe.srem(self._keys.gateways, gateway_id)
                pipe.delete(lease)
                await pipe.execute()

        await self._read(forget)
        return Deletions(
            exchanges=tuple(exchanges),
            queues=tuple(queues),
            bindings=tuple(bindings),
            touches_durable=any(x.durable for x in exchanges),  # exclusive queues never are
        )

    # --- delivery leases: one gateway at a time delivers each queue partition ---

    async def hold_lease(self, name: str, owner: str, ttl_ms: int) -> int | None:
        """Take lease ``name`` for ``owner`` when it is free, or extend it when ``owner``
        holds it. Returns the lease's fencing token (a new, larger one each time the lease
        changes hands), or None when another owner holds it."""
        key = self._keys.delivery_lease(name)
        tokens = self._keys.lease_tokens()
        found = await self._conn.run(
            lambda: self._hold_script(keys=[key, tokens], args=[owner, ttl_ms])
        )
        return None if found is None else int(found)

    async def drop_lease(self, name: str, owner: str) -> None:
        """Give lease ``name`` up if ``owner`` holds it (its consumers left)."""
        key = self._keys.delivery_lease(name)
        await self._conn.run(lambda: self._drop_script(keys=[key], args=[owner]))

    def _hold_script(self, **call: Any) -> Any:
        return self._script("_hold_lease_script", _HOLD_LEASE)(**call)

    def _drop_script(self, **call: Any) -> Any:
        return self._script("_drop_lease_script", _DROP_LEASE)(**call)

    def _script(self, attribute: str, source: str) -> Any:
        """A Lua script registered on first use (the base class's __init__ is shared)."""
        script = getattr(self, attribute, None)
        if script is None:
            script = self._conn.client.register_script(source)
            setattr(self, attribute, script)
        return script

    # --- broker registry ---

    async def register_broker(self, group: str, broker_id: str, address: str, ttl_ms: int) -> None:
        async def heartbeat() -> None:
            seconds, microseconds = await self._conn.client.time()
            seen_ms = seconds * 1000 + microseconds // 1000
            entry: dict[str, str | int] = {"group": group, "broker_id": broker_id}
            entry |= {"address": address, "last_seen_ms": seen_ms}
            async with self._conn.client.pipeline(transaction=True) as pipe:
                pipe.hset(self._keys.brokers, key_of(group, broker_id), json.dumps(entry))
                pipe.set(self._keys.broker_lease(group, broker_id), str(seen_ms), px=ttl_ms)
                await pipe.execute()

        await self._conn.run(heartbeat)

    async def list_brokers(self) -> list[BrokerInfo]:
        async def read() -> list[BrokerInfo]:
            replies = await self._conn.client.hgetall(self._keys.brokers)
            entries = {text(f): text(v) for f, v in replies.items()}
            fields = sorted(entries)
            async with self._conn.client.pipeline(transaction=False) as pipe:
                for field in fields:
                    pipe.exists(self._keys.broker_lease(*parse_key(field)))
                live = await pipe.execute()
            brokers = []
            for field, alive in zip(fields, live, strict=True):
                entry = json.loads(entries[field])
                brokers.append(BrokerInfo(**entry, alive=bool(alive)))
            return brokers

        return await self._conn.run(read)

    # --- placement ---

    async def place_queue(
        self, vhost: str, name: str, partitions: int, groups: Iterable[str]
    ) -> list[str]:
        candidates = list(groups)

        async def body(view: TopologyView) -> list[str]:
            if await view.queue(vhost, name) is None:
                raise queue_not_found(vhost, name)
            placed = await view.route(vhost, name)
            if placed is not None:
                return placed
            replies = await view.tx.pipe.hgetall(self._keys.placement_load)
            load = {text(group): int(count) for group, count in replies.items()}
            chosen = spread_partitions(partitions, candidates, load)
            route = self._keys.route(vhost, name)
            view.tx.write("SET", route, json.dumps(chosen))
            for group in chosen:
                view.tx.write("HINCRBY", self._keys.placement_load, group, 1)
            view.tx.publish([Change("placement.set", vhost, name, {"partitions": chosen})])
            return chosen

        return await self._transact(body)

    async def queue_placement(self, vhost: str, name: str) -> list[str] | None:
        key = self._keys.route(vhost, name)
        text = await self._read(lambda: self._conn.client.get(key))
        return None if text is None else [str(g) for g in json.loads(text)]
