"""What the gateways of a cluster show of each other (gateway/cluster/views.py), in Redis.

- **Views.** ``<prefix>view:<gateway>`` holds one gateway's objects (connections, channels,
  consumers, node figures) as opaque JSON text, written with a TTL and rewritten (or only
  its TTL renewed, when nothing changed) by that gateway every second, so a dead gateway's
  objects vanish when the TTL runs out. ``read_views`` reads every registered gateway's
  (the set ``<prefix>gateways``) in one Lua call.
- **Requests.** An action on an object another gateway holds (closing a connection) is a
  JSON request pushed to ``<prefix>view-requests:<gateway>`` (read with BLPOP by that
  gateway) and answered on ``<prefix>view-answer:<request id>``, as lease hand-overs are.
- **Consumer claims.** ``<vhost>:consumers:<queue>``, a hash: gateway -> "<Redis ms> x|c",
  says which gateways have consumers on the queue ("c") or an exclusive one ("x"). A claim
  is checked and written in one Lua call (so two gateways cannot both win), stamped with
  Redis's clock; a stamp older than ``fresh_ms`` is a gateway gone and is deleted on the way.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass

from meta import request_lists
from meta.redis_conn import text
from meta.redis_store import RedisMetadataStore

# KEYS: the gateway set; ARGV: the view key prefix. Answers [gateway, view, ...].
_READ_VIEWS = """
local found = {}
for _, gateway in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local view = redis.call('GET', ARGV[1] .. gateway)
  if view then
    table.insert(found, gateway)
    table.insert(found, view)
  end
end
return found
"""
# KEYS: claim hashes; ARGV: gateway, fresh ms, mode ("claim" | "renew"), then one kind per
# key ("x" exclusive, "c" consumers). Answers one entry per key: the gateway in the way ("").
# "claim" writes only where nobody is in the way, and never lowers the caller's "x" to "c"
# (its other consumers decide that at the next renewal); "renew" writes whatever it finds.
_CLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local fresh = tonumber(ARGV[2])
local answers = {}
for i, key in ipairs(KEYS) do
  local wanted = ARGV[3 + i]
  local mine = ''
  local other = ''
  local all = redis.call('HGETALL', key)
  for j = 1, #all, 2 do
    local stamp, kind = string.match(all[j + 1], '^(%d+) (%a)$')
    if not stamp or now - tonumber(stamp) > fresh then
      redis.call('HDEL', key, all[j])
    elseif all[j] == ARGV[1] then
      mine = kind
    elseif kind == 'x' or wanted == 'x' then
      other = all[j]
    end
  end
  if other == '' or ARGV[3] == 'renew' then
    if ARGV[3] == 'claim' and mine == 'x' then wanted = 'x' end
    redis.call('HSET', key, ARGV[1], now .. ' ' .. wanted)
    redis.call('PEXPIRE', key, fresh * 2)
  end
  table.insert(answers, other)
end
return answers
"""

# KEYS: claim hashes; ARGV: fresh ms. Answers one entry per key: the gateways with a fresh
# claim on it, space-separated (nothing written: the claimers tidy their own hashes).
_CLAIMERS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local answers = {}
for i, key in ipairs(KEYS) do
  local fresh = {}
  local all = redis.call('HGETALL', key)
  for j = 1, #all, 2 do
    local stamp = string.match(all[j + 1], '^(%d+) ')
    if stamp and now - tonumber(stamp) <= tonumber(ARGV[1]) then
      table.insert(fresh, all[j])
    end
  end
  table.insert(answers, table.concat(fresh, ' '))
end
return answers
"""


@dataclass(frozen=True)
class ViewRequest:
    request_id: str
    action: str  # "close"
    name: str  # the object's name (a connection's)
    reason: str


class ClusterViewStore:
    """The views, requests and consumer claims of one cluster's gateways, over the metadata
    store's Redis. Every call raises MetadataUnavailable when Redis cannot be reached."""

    def __init__(self, store: RedisMetadataStore) -> None:
        self._conn = store._conn
        self._keys = store._keys
        self._read_script = self._conn.client.register_script(_READ_VIEWS)
        self._claim_script = self._conn.client.register_script(_CLAIM)
        self._claimers_script = self._conn.client.register_script(_CLAIMERS)

    # --- views ---

    async def write_view(self, gateway_id: str, view: str, ttl_ms: int) -> None:
        key = self._keys.view(gateway_id)
        await self._conn.run(lambda: self._conn.client.set(key, view, px=ttl_ms))

    async def renew_view(self, gateway_id: str, ttl_ms: int) -> bool:
        """Renew the TTL of this gateway's unchanged view; False if it is gone."""
        key = self._keys.view(gateway_id)
        return bool(await self._conn.run(lambda: self._conn.client.pexpire(key, ttl_ms)))

    async def drop_view(self, gateway_id: str) -> None:
        key = self._keys.view(gateway_id)
        await self._conn.run(lambda: self._conn.client.delete(key))

    async def read_views(self) -> dict[str, str]:
        """Every gateway's view still in Redis (its own included), by gateway."""
        keys = [self._keys.gateways]
        args = [self._keys.view("")]
        found = await self._conn.run(lambda: self._read_script(keys=keys, args=args))
        items = [text(item) for item in found]
        return dict(zip(items[0::2], items[1::2], strict=True))

    # --- requests to the gateway holding an object ---

    async def ask(self, gateway_id: str, request: ViewRequest, wait_s: float) -> str | None:
        """Send ``request`` to ``gateway_id``; its answer, or None if none came in ``wait_s``."""
        requests = self._keys.view_requests(gateway_id)
        answer = self._keys.view_answer(request.request_id)
        body = json.dumps(
            {"id": request.request_id, "action": request.action, "name": request.name}
            | {"reason": request.reason}
        )

        return await request_lists.ask(self._conn, requests, answer, body, wait_s)

    async def requests(self, gateway_id: str, wait_s: float) -> list[ViewRequest]:
        """The requests made to ``gateway_id``, waiting up to ``wait_s`` for the first."""
        key = self._keys.view_requests(gateway_id)
        found = []
        for raw in await request_lists.take(self._conn, key, wait_s):
            with contextlib.suppress(ValueError, KeyError, TypeError):
                parsed = json.loads(raw)
                found.append(
                    ViewRequest(
                        str(parsed["id"]),
                        str(parsed["action"]),
                        str(parsed["name"]),
                        str(parsed["reason"]),
                    )
                )
        return found

    async def answer(self, request_id: str, answer: str) -> None:
        await request_lists.push(self._conn, self._keys.view_answer(request_id), answer)

    # --- consumer claims: who consumes a queue, and whether exclusively ---

    async def claim(
        self, gateway_id: str, vhost: str, queue: str, exclusive: bool, fresh_ms: int
    ) -> str | None:
        """Claim the queue for a consumer here (``exclusive``: for an exclusive one); None
        when granted, else the gateway in the way (an exclusive consumer there, or, for an
        exclusive claim, any consumer there). Nothing is written when refused."""
        key = self._keys.consumer_claims(vhost, queue)
        args: list[str | int] = [gateway_id, fresh_ms, "claim", "x" if exclusive else "c"]
        answers = await self._conn.run(lambda: self._claim_script(keys=[key], args=args))
        other = text(answers[0])
        return other or None

    async def renew_claims(
        self, gateway_id: str, kinds: Mapping[tuple[str, str], bool], fresh_ms: int
    ) -> dict[tuple[str, str], str]:
        """Renew this gateway's claims, (vhost, queue) -> exclusive, all in one call; the
        queues on which another gateway is in the way (a claim that had lapsed, Redis
        having been out of reach longer than ``fresh_ms``), with that gateway."""
        if not kinds:
            return {}
        queues = list(kinds)
        keys = [self._keys.consumer_claims(v, q) for v, q in queues]
        args: list[str | int] = [gateway_id, fresh_ms, "renew"]
        args += ["x" if kinds[q] else "c" for q in queues]
        answers = await self._conn.run(lambda: self._claim_script(keys=keys, args=args))
        return {q: text(a) for q, a in zip(queues, answers, strict=True) if text(a)}

    async def claimers(
        self, queues: list[tuple[str, str]], fresh_ms: int
    ) -> dict[tuple[str, str], list[str]]:
        """The gateways with consumers on each of ``queues`` (a fresh claim), sorted."""
        if not queues:
            return {}
        keys = [self._keys.consumer_claims(v, q) for v, q in queues]
        answers = await self._conn.run(lambda: self._claimers_script(keys=keys, args=[fresh_ms]))
        return {q: sorted(text(a).split()) for q, a in zip(queues, answers, strict=True)}

    async def release_claims(self, gateway_id: str, queues: list[tuple[str, str]]) -> None:
        """This gateway has no consumer left on ``queues``."""
        if not queues:
            return

        async def release() -> None:
            async with self._conn.client.pipeline(transaction=False) as pipe:
                for vhost, queue in queues:
                    pipe.hdel(self._keys.consumer_claims(vhost, queue), gateway_id)
                await pipe.execute()

        await self._conn.run(release)
