"""meta.cluster.ClusterRegistry on Redis: gateway leases, broker heartbeats, placement.

Leases are keys with a TTL (PX), so Redis's clock decides when one lapses; the set
``<prefix>gateways`` remembers every registered gateway so a lapsed one (key gone) can
still be found and reaped (its exclusive queues deleted, its connections no longer counted
against vhost limits, meta.redis_limits). A gateway's exclusive queues are found through the
owner sets ``<prefix>owner:<gateway_id>/<n>`` (one per connection, kept by declare and delete), by
SCAN: reaping is rare, and per-connection sets keep closing a connection cheap.

Delivery leases are ``<prefix>lease:<name>`` ("<owner> <token>", with a TTL), tokens from
``<prefix>lease-tokens``. Beside each, ``<prefix>lease-handed:<name>`` keeps the note for the
next holder: "<token> <mark>" once the holder gave the lease up with a mark, "<token> -"
while it holds it (a lapse leaves that). A gateway asks another for leases through the list
``<prefix>handover:<gateway>`` (read with BLPOP) and gets the answer on
``<prefix>handover-answer:<request id>``.

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

import contextlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from meta import request_lists
from meta.change_feed import Change
from meta.cluster import (
    TOKEN_TAG_BITS,
    BrokerInfo,
    HandedNote,
    HandOverRequest,
    LeaseState,
    owner_tag,
    spread_partitions,
)
from meta.errors import queue_not_found
from meta.models import BindingDef, Deletions, ExchangeDef, QueueDef
from meta.redis_base import RedisStoreBase
from meta.redis_conn import text
from meta.redis_topology import TopologyView
from meta.serialization import key_of, parse_key

# KEYS: lease, token counter, handed note; ARGV: owner, ttl ms, note ttl ms, owner's tag,
# counter floor (a broker saw a token made from it: values up to it are spent), the counter's
# weight (1 << TOKEN_TAG_BITS). The lease's value is "<owner> <token>", the token
# "<counter> << TOKEN_TAG_BITS | <tag>" (meta/cluster.py); the
# note's "<token> <mark>" once that holder gave the lease up with a mark, "<token> -" while it
# holds it. Answers {state, holder, token, note before}: "renewed" (the owner's already),
# "taken" (the owner's now, a new token; the note the last holder left, or ""), "held"
# (another's).
_HOLD_LEASE = """
local held = redis.call('GET', KEYS[1])
if held then
  local owner, token = string.match(held, '^(.*) (%d+)$')
  if owner == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {'renewed', owner, token, ''}
  end
  return {'held', owner, token, ''}
end
local n = redis.call('INCR', KEYS[2])
if n <= tonumber(ARGV[5]) then
  n = tonumber(ARGV[5]) + 1
  redis.call('SET', KEYS[2], n)
end
local token = string.format('%.0f', n * tonumber(ARGV[6]) + tonumber(ARGV[4]))
local before = redis.call('GET', KEYS[3]) or ''
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. token, 'PX', ARGV[2])
redis.call('SET', KEYS[3], token .. ' -', 'PX', ARGV[3])
return {'taken', ARGV[1], token, before}
"""
# KEYS: lease, handed note; ARGV: owner, mark ("": none), note ttl ms.
# KEYS: queue-id counter. ARGV: floor. The counter, raised to the floor if below it.
_RAISE_COUNTER = """
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n < tonumber(ARGV[1]) then
  n = tonumber(ARGV[1])
  redis.call('SET', KEYS[1], n)
end
return n
"""

_DROP_LEASE = """
local held = redis.call('GET', KEYS[1])
if not held then
  return 0
end
local owner, token = string.match(held, '^(.*) (%d+)$')
if owner ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if ARGV[2] ~= '' then
  redis.call('SET', KEYS[2], token .. ' ' .. ARGV[2], 'PX', ARGV[3])
end
return 1
"""
# A handed note outlives its lease this long: it only ever makes the next holder flag less,
# and a note gone makes it flag what it cannot know about (as for a lease that lapsed).
HANDED_NOTE_TTL_MS = 86_400_000


def _handed(note: str) -> HandedNote | None:
    token, _, mark = note.partition(" ")
    if not token.isdigit():
        return None
    return HandedNote(int(token), int(mark) if mark.isdigit() else None)


class RedisClusterRegistry(RedisStoreBase):
    async def delete_exclusive_queues(self, owner: str) -> Deletions:
        raise NotImplementedError  # RedisMetadataStore's, used by reap_gateway

    async def forget_connections(self, gateway_id: str) -> None:
        raise NotImplementedError  # meta.redis_limits', used by reap_gateway

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
        await self.forget_connections(gateway_id)  # no longer counted against max-connections

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
        changes hands, never one another owner got), or None when another owner holds it."""
        state = await self.take_lease(name, owner, ttl_ms)
        return state.token if state.mine else None

    async def take_lease(self, name: str, owner: str, ttl_ms: int, floor: int = 0) -> LeaseState:
        """``hold_lease``, answering who holds the lease, and, when it just changed hands to
        ``owner``, the note its last holder left giving it up (``drop_lease``'s mark). A new
        token's counter is above ``floor`` (``token_counter`` of a token a broker refused
        ours for: Redis lost the writes that spent those values)."""
        keys = [self._keys.delivery_lease(name), self._keys.lease_tokens()]
        keys.append(self._keys.lease_handed(name))
        args = [owner, ttl_ms, HANDED_NOTE_TTL_MS, owner_tag(owner), floor, 1 << TOKEN_TAG_BITS]
        state, holder, token, before = await self._conn.run(
            lambda: self._hold_script(keys=keys, args=args)
        )
        taken = text(state) == "taken"
        return LeaseState(
            holder=text(holder),
            token=int(token),
            mine=text(state) != "held",
            taken=taken,
            handed=_handed(text(before)) if taken else None,
        )

    async def drop_lease(self, name: str, owner: str, mark: int | None = None) -> None:
        """Give lease ``name`` up if ``owner`` holds it (its consumers left). ``mark``: the
        note for the next holder (the offset below which a message may have been delivered
        and not settled); without one, the next holder is told nothing (as after a lapse)."""
        keys = [self._keys.delivery_lease(name), self._keys.lease_handed(name)]
        args = [owner, "" if mark is None else str(mark), HANDED_NOTE_TTL_MS]
        await self._conn.run(lambda: self._drop_script(keys=keys, args=args))

    # --- hand-over requests: a gateway asks a lease holder to give leases up ---

    async def ask_hand_over(
        self, holder: str, names: list[str], request_id: str, wait_s: float
    ) -> str | None:
        """Ask gateway ``holder`` to give the leases ``names`` up, and wait up to ``wait_s``
        for its answer (``answer_hand_over``'s); None if none came."""
        requests = self._keys.hand_over_requests(holder)
        answer = self._keys.hand_over_answer(request_id)
        request = json.dumps({"id": request_id, "names": names})
        return await request_lists.ask(self._conn, requests, answer, request, wait_s)

    async def hand_over_requests(self, gateway_id: str, wait_s: float) -> list[HandOverRequest]:
        """The requests made to ``gateway_id``, waiting up to ``wait_s`` for the first."""
        key = self._keys.hand_over_requests(gateway_id)
        requests = []
        for raw in await request_lists.take(self._conn, key, wait_s):
            with contextlib.suppress(ValueError, KeyError, TypeError):
                parsed = json.loads(raw)
                names = tuple(str(n) for n in parsed["names"])
                requests.append(HandOverRequest(str(parsed["id"]), names))
        return requests

    async def answer_hand_over(self, request_id: str, answer: str) -> None:
        await request_lists.push(self._conn, self._keys.hand_over_answer(request_id), answer)

    async def raise_queue_ids(self, floor: int) -> int:
        keys, args = [self._keys.queue_ids], [floor]
        script = self._script("_raise_counter_script", _RAISE_COUNTER)
        return int(await self._conn.run(lambda: script(keys=keys, args=args)))

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
            if await self._conn.client.sismember(self._keys.retired_groups, group):
                return  # removed from the cluster: never listed again
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

    async def extend_placement(self, vhost: str, name: str, groups: Sequence[str]) -> list[str]:
        wanted = list(groups)

        async def body(view: TopologyView) -> list[str]:
            if await view.queue(vhost, name) is None:
                raise queue_not_found(vhost, name)
            placed = await view.route(vhost, name) or []
            if len(placed) >= len(wanted):
                return placed
            grown = placed + wanted[len(placed) :]
            view.tx.write("SET", self._keys.route(vhost, name), json.dumps(grown))
            for group in wanted[len(placed) :]:
                view.tx.write("HINCRBY", self._keys.placement_load, group, 1)
            view.tx.publish([Change("placement.set", vhost, name, {"partitions": grown})])
            return grown

        return await self._transact(body)

    async def repoint_placement(
        self, vhost: str, name: str, partitions: Mapping[int, str]
    ) -> list[str]:
        moved = dict(partitions)

        async def body(view: TopologyView) -> list[str]:
            placed = await view.route(vhost, name)
            if placed is None:
                raise queue_not_found(vhost, name)
            grown = list(placed)
            for p, group in moved.items():
                if p < len(grown) and grown[p] != group:
                    view.tx.write("HINCRBY", self._keys.placement_load, grown[p], -1)
                    view.tx.write("HINCRBY", self._keys.placement_load, group, 1)
                    grown[p] = group
            view.tx.write("SET", self._keys.route(vhost, name), json.dumps(grown))
            document = {"partitions": grown, "repointed": True}
            view.tx.publish([Change("placement.set", vhost, name, document)])
            return grown

        return await self._transact(body)

    async def retire_group(self, group: str) -> None:
        async def forget() -> None:
            fields = [f for f in await self._conn.client.hkeys(self._keys.brokers)
                      if parse_key(text(f))[0] == group]  # fmt: skip
            async with self._conn.client.pipeline(transaction=True) as pipe:
                for field in fields:
                    pipe.hdel(self._keys.brokers, field)
                    pipe.delete(self._keys.broker_lease(*parse_key(text(field))))
                pipe.hdel(self._keys.placement_load, group)
                pipe.sadd(self._keys.retired_groups, group)
                await pipe.execute()

        await self._conn.run(forget)

    async def queue_placement(self, vhost: str, name: str) -> list[str] | None:
        key = self._keys.route(vhost, name)
        text = await self._read(lambda: self._conn.client.get(key))
        return None if text is None else [str(g) for g in json.loads(text)]
