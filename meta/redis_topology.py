"""One optimistic transaction of the Redis store, and the slice of topology it reads.

Theory of operation: a mutation WATCHes every key it reads before reading it, loads what
it read into a fresh ``MetadataState`` (only the vhosts, exchanges, queues and bindings the
operation can touch), lets state.py decide exactly as the local store does (equivalence,
exclusivity, cascades), and turns the outcome into writes and change-feed entries sent in
one MULTI/EXEC. If another writer changed a watched key in between, EXEC fails with
WatchError and RedisConnection.run starts the attempt again from scratch.

What must be loaded for state.py to decide correctly:
- an entity that is looked up (missing in Redis = missing in the view);
- ``by_source[x]`` complete for every auto-delete exchange x whose binding may be removed
  (removing its last binding deletes it) and for an exchange being deleted (if-unused);
  for other exchanges only the bindings being removed need be there;
- ``by_destination[e]`` complete for every exchange or queue that may be removed, i.e. the
  target and every auto-delete exchange reachable upstream through bindings (the closure).
Destinations of outgoing bindings are read without WATCH: they only feed
``Deletions.touches_durable``, and a concurrent change to them also changes a watched hash.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from redis.asyncio.client import Pipeline

from meta.change_feed import Change, vhost_added_changes
from meta.models import BindingDef, Deletions, ExchangeDef, QueueDef, VHost
from meta.redis_conn import text
from meta.redis_keys import RedisKeys, binding_field
from meta.redis_replicated import WRITTEN_TTL_MS
from meta.serialization import dumps, key_of, loads
from meta.state import Endpoint, MetadataState, VHostState

Command = tuple[str | int, ...]


class Tx:
    """One attempt: watched reads first (each runs at once), then the queued commands and
    change entries in one MULTI/EXEC."""

    def __init__(
        self, pipe: Pipeline, keys: RedisKeys, feed_max_len: int, written_key: str | None = None
    ) -> None:
        self.pipe = pipe
        self.keys = keys
        self._feed_max_len = feed_max_len
        # With Sentinel: set with every commit, even one that changes nothing, so that the
        # store can tell once the records read and written can no longer be lost
        # (meta/redis_replicated.py).
        self._written_key = written_key
        self._writes: list[Command] = []
        self._changes: list[Change] = []
        self._results: list[Any] | None = None  # EXEC's replies, once committed

    async def get(self, key: str) -> str | None:
        await self.pipe.watch(key)
        value = await self.pipe.get(key)
        return None if value is None else text(value)

    async def hget(self, key: str, field: str) -> str | None:
        await self.pipe.watch(key)
        value = await self.pipe.hget(key, field)
        return None if value is None else text(value)

    async def hgetall(self, key: str) -> dict[str, str]:
        await self.pipe.watch(key)
        return {text(k): text(v) for k, v in (await self.pipe.hgetall(key)).items()}

    async def smembers(self, key: str) -> list[str]:
        await self.pipe.watch(key)
        return sorted(text(member) for member in await self.pipe.smembers(key))

    def write(self, *command: str | int) -> None:
        """Queue a command for EXEC, e.g. ``write("HSET", key, field, value)``."""
        self._writes.append(command)

    def publish(self, changes: Iterable[Change]) -> None:
        self._changes.extend(changes)

    async def commit(self) -> list[Any]:
        """EXEC the writes and the change entries together, once; [] if nothing to do."""
        if self._results is not None:
            return self._results
        if not self._writes and not self._changes and self._written_key is None:
            self._results = []
            return self._results
        self.pipe.multi()  # type: ignore[no-untyped-call]
        for command in self._writes:
            self.pipe.execute_command(*command)
        if self._written_key is not None:
            self.pipe.execute_command("SET", self._written_key, "1", "PX", WRITTEN_TTL_MS)
        trim = ("MAXLEN", "~", self._feed_max_len)  # approximate: trims whole nodes, cheaply
        for item in self._changes:
            fields = [part for pair in item.to_fields().items() for part in pair]
            self.pipe.execute_command("XADD", self.keys.changes, *trim, "*", *fields)
        self._results = await self.pipe.execute()
        return self._results


class TopologyView:
    """The part of the metadata one transaction needs, as a MetadataState."""

    def __init__(
        self, tx: Tx, exchange_types: Iterable[str], max_topic_hash_wildcards: int | None
    ) -> None:
        self.tx = tx
        self.keys = tx.keys
        self.state = MetadataState(self._take_queue_id, exchange_types, max_topic_hash_wildcards)
        self.routes: dict[tuple[str, str], list[str]] = {}
        self._read: set[str] = set()  # keys read and watched (present or not)
        self._peeked: set[str] = set()  # keys read without WATCH (a watched read redoes them)
        self._queue_id: int | None = None

    # --- queue ids ---

    def _take_queue_id(self) -> int:
        assert self._queue_id is not None, "reserve_queue_id() before creating a queue"
        queue_id, self._queue_id = self._queue_id, None
        return queue_id

    async def reserve_queue_id(self) -> None:
        """INCR outside the transaction: an attempt that does not commit skips its id, so an id
        is never handed out twice (ids are unique, not dense)."""
        self._queue_id = int(await self.tx.pipe.incr(self.keys.queue_ids))

    # --- loading ---

    async def vhost(self, name: str) -> VHostState | None:
        if name in self.state.vhosts:
            return self.state.vhosts[name]
        marker = "vhost\0" + name
        if marker in self._read:
            return None
        self._read.add(marker)
        document = await self.tx.hget(self.keys.vhosts, name)
        if document is None:
            return None
        state = self.state.vhosts[name] = VHostState(loads(VHost, document))
        return state

    async def exchange(self, vhost: str, name: str) -> ExchangeDef | None:
        state = await self.vhost(vhost)
        key = self.keys.exchange(vhost, name)
        if state is not None and key not in self._read:
            self._read.add(key)
            document = await self.tx.get(key)
            state.exchanges.pop(name, None)  # a peek (see _load_unwatched) may have found it
            if document is not None:
                state.exchanges[name] = loads(ExchangeDef, document)
        return state.exchanges.get(name) if state else None

    async def queue(self, vhost: str, name: str) -> QueueDef | None:
        state = await self.vhost(vhost)
        key = self.keys.queue(vhost, name)
        if state is not None and key not in self._read:
            self._read.add(key)
            document = await self.tx.get(key)
            state.queues.pop(name, None)
            if document is not None:
                state.queues[name] = loads(QueueDef, document)
        return state.queues.get(name) if state else None

    async def _bindings(self, vhost: str, key: str) -> list[BindingDef]:
        state = await self.vhost(vhost)
        if state is None or key in self._read:
            return []
        self._read.add(key)
        bindings = [loads(BindingDef, t) for t in (await self.tx.hgetall(key)).values()]
        for binding in bindings:
            _add_binding(state, binding)
        return bindings

    async def source(self, vhost: str, name: str) -> ExchangeDef | None:
        """Exchange ``name`` with all its outgoing bindings and their destinations."""
        exchange = await self.exchange(vhost, name)
        if exchange is None:
            return None
        bindings = await self._bindings(vhost, self.keys.outgoing(vhost, name))
        await self._load_unwatched(vhost, [(b.destination_type, b.destination) for b in bindings])
        return exchange

    async def incoming(self, vhost: str, endpoint: Endpoint) -> list[BindingDef]:
        return await self._bindings(vhost, self.keys.incoming(vhost, *endpoint))

    async def _load_unwatched(self, vhost: str, endpoints: list[Endpoint]) -> None:
        state = self.state.vhosts.get(vhost)
        known = self._read | self._peeked
        missing = [e for e in set(endpoints) if self._entity_key(vhost, e) not in known]
        if state is None or not missing:
            return
        documents = await self.tx.pipe.mget([self._entity_key(vhost, e) for e in missing])
        for (kind, name), document in zip(missing, documents, strict=True):
            self._peeked.add(self._entity_key(vhost, (kind, name)))
            if document is None:
                continue
            if kind == "queue":
                state.queues[name] = loads(QueueDef, document)
            else:
                state.exchanges[name] = loads(ExchangeDef, document)

    def _entity_key(self, vhost: str, endpoint: Endpoint) -> str:
        kind, name = endpoint
        return self.keys.queue(vhost, name) if kind == "queue" else self.keys.exchange(vhost, name)

    async def stored_binding(self, binding: BindingDef, *, watch: bool) -> None:
        """Just this binding. Bind reads it without WATCH (a racing duplicate bind is settled
        by HSETNX at EXEC, see RedisMetadataStore.bind); unbind watches the source's hash."""
        state = await self.vhost(binding.vhost)
        if state is None:
            return
        field, key = binding_field(binding), self.keys.outgoing(binding.vhost, binding.source)
        if watch:
            await self.tx.pipe.watch(key)
        stored = await self.tx.pipe.hget(key, field)
        if stored is not None:
            _add_binding(state, loads(BindingDef, stored))

    async def route(self, vhost: str, queue: str) -> list[str] | None:
        if (vhost, queue) not in self.routes:
            document = await self.tx.get(self.keys.route(vhost, queue))
            if document is None:
                return None
            self.routes[(vhost, queue)] = [str(group) for group in json.loads(document)]
        return self.routes[(vhost, queue)]

    async def removal_closure(self, vhost: str, roots: Iterable[Endpoint]) -> None:
        """Everything removing ``roots`` can cascade to (see the module docstring)."""
        pending, seen = list(roots), set[Endpoint]()
        while pending:
            endpoint = pending.pop()
            if endpoint in seen:
                continue
            seen.add(endpoint)
            kind, name = endpoint
            if kind == "queue":
                if await self.queue(vhost, name) is None:
                    continue
                await self.route(vhost, name)
            elif await self.source(vhost, name) is None:
                continue
            for binding in await self.incoming(vhost, endpoint):
                # Only an auto-delete source can cascade, so only its outgoing set must be
                # complete (loaded when it is taken from ``pending``): deleting a queue bound
                # to amq.topic must not read amq.topic's every binding.
                upstream = await self.exchange(vhost, binding.source)
                if upstream is not None and upstream.auto_delete:
                    pending.append(("exchange", binding.source))

    async def whole_vhost(self, vhost: str) -> None:
        if await self.vhost(vhost) is None:
            return
        for name in await self.tx.smembers(self.keys.exchange_index(vhost)):
            await self.source(vhost, name)
        for name in await self.tx.smembers(self.keys.queue_index(vhost)):
            await self.queue(vhost, name)
            await self.route(vhost, name)

    # --- writing what state.py decided ---

    def create_vhost(self, vhost: VHost) -> None:
        """A vhost found missing by ``vhost()``, with its predeclared exchanges."""
        self.state.add_vhost(vhost)
        exchanges = list(self.state.vhosts[vhost.name].exchanges.values())
        self.tx.write("HSET", self.keys.vhosts, vhost.name, dumps(vhost))
        for exchange in exchanges:
            self.write_exchange(exchange)
        self.tx.publish(vhost_added_changes(vhost, exchanges))

    def write_exchange(self, exchange: ExchangeDef) -> None:
        self.tx.write("SET", self.keys.exchange(exchange.vhost, exchange.name), dumps(exchange))
        self.tx.write("SADD", self.keys.exchange_index(exchange.vhost), exchange.name)

    def write_queue(self, queue: QueueDef) -> None:
        self.tx.write("SET", self.keys.queue(queue.vhost, queue.name), dumps(queue))
        self.tx.write("SADD", self.keys.queue_index(queue.vhost), queue.name)
        if queue.exclusive_owner is not None:
            owner = self.keys.owner(queue.exclusive_owner)
            self.tx.write("SADD", owner, key_of(queue.vhost, queue.name))

    def write_binding(self, binding: BindingDef) -> None:
        """HSETNX first: its reply (EXEC result 0) says whether the binding is new."""
        field, document = binding_field(binding), dumps(binding)
        destination = (binding.destination_type, binding.destination)
        self.tx.write("HSETNX", self.keys.outgoing(binding.vhost, binding.source), field, document)
        self.tx.write("HSET", self.keys.incoming(binding.vhost, *destination), field, document)

    def write_deletions(self, deletions: Deletions) -> None:
        keys = self.keys
        for b in deletions.bindings:
            field = binding_field(b)
            self.tx.write("HDEL", keys.outgoing(b.vhost, b.source), field)
            self.tx.write("HDEL", keys.incoming(b.vhost, b.destination_type, b.destination), field)
        for q in deletions.queues:
            self._delete_queue(q)
        for x in deletions.exchanges:
            doomed = [keys.exchange(x.vhost, x.name), keys.outgoing(x.vhost, x.name)]
            self.tx.write("DEL", *doomed, keys.incoming(x.vhost, "exchange", x.name))
            self.tx.write("SREM", keys.exchange_index(x.vhost), x.name)

    def _delete_queue(self, q: QueueDef) -> None:
        keys = self.keys
        doomed = [keys.queue(q.vhost, q.name), keys.incoming(q.vhost, "queue", q.name)]
        self.tx.write("DEL", *doomed, keys.route(q.vhost, q.name))
        self.tx.write("SREM", keys.queue_index(q.vhost), q.name)
        if q.exclusive_owner is not None:
            self.tx.write("SREM", keys.owner(q.exclusive_owner), key_of(q.vhost, q.name))
        for group in self.routes.get((q.vhost, q.name)) or []:
            self.tx.write("HINCRBY", keys.placement_load, group, -1)


def _add_binding(state: VHostState, binding: BindingDef) -> None:
    identity = binding.identity
    state.by_source.setdefault(binding.source, {})[identity] = binding
    endpoint = (binding.destination_type, binding.destination)
    state.by_destination.setdefault(endpoint, {})[identity] = binding
