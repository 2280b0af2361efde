"""RedisMetadataStore: the cluster's metadata in Redis, shared by every gateway.

Same contract as LocalMetadataStore (tests/meta/test_meta_contract.py runs both), with the
same rules: each mutation is an optimistic transaction (meta.redis_topology) in which
state.py and checks.py decide, so two gateways declaring one queue with different
arguments get one success and one PRECONDITION_FAILED. Reads are single commands or one
read-only Lua script (lists), never a transaction. Every mutation appends its changes to
the ``<prefix>changes`` stream in the same MULTI/EXEC (meta.redis_feed follows it).

- Durable and transient entities are all kept in Redis (durability is a property of the
  data, the gateway decides what a restart forgets; Redis's AOF keeps everything).
- Queue ids come from INCR on ``<prefix>queue-ids``: never handed out twice while Redis
  keeps its data.
- On first use a fresh Redis gets vhost "/" and, unless ``default_user=False``, the user
  guest/guest (administrator) with full rights on "/", as a fresh RabbitMQ does.
- Unreachable Redis: each call retries for ``unavailable_timeout_s`` then raises
  MetadataUnavailable (meta.redis_conn); the next call reconnects by itself.
- asyncio only: constructing or calling it under trio raises AsyncioRequired.
- Standalone Redis (or Sentinel): the list scripts read keys they compute, which Redis
  Cluster forbids.
- The cluster calls (leases, brokers, placement) come from RedisClusterRegistry.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from meta import checks
from meta.change_feed import ChangeEvent, change, deletion_changes, vhost_deleted_changes
from meta.errors import vhost_not_found
from meta.models import BindingDef, Deletions, ExchangeDef, QueueDef, User, VHost, VHostLimits
from meta.redis_base import RedisStoreBase
from meta.redis_cluster import RedisClusterRegistry
from meta.redis_feed import current_position, follow_changes
from meta.redis_gray import GrayRulesMixin
from meta.redis_limits import VHostLimitsMixin
from meta.redis_records import RecordsMixin
from meta.redis_routes import QueueRoutesMixin
from meta.redis_topology import TopologyView
from meta.serialization import dumps, loads, parse_key


class RedisMetadataStore(
    QueueRoutesMixin,
    GrayRulesMixin,
    VHostLimitsMixin,
    RecordsMixin,
    RedisClusterRegistry,
    RedisStoreBase,
):
    """A MetadataStore and ClusterRegistry on Redis. Construct once per process."""

    async def _list(self, vhost: str, index: str, member_prefix: str, how: str) -> list[str]:
        keys = [self._keys.vhosts, index]
        found = await self._read(lambda: self._list_script(keys, [vhost, member_prefix, how]))
        if found is None:
            raise vhost_not_found(vhost)
        return list(found)

    # --- vhosts ---

    async def list_vhosts(self) -> list[VHost]:
        texts = await self._read(lambda: self._conn.client.hvals(self._keys.vhosts))
        return sorted((loads(VHost, t) for t in texts), key=lambda v: v.name)

    async def get_vhost(self, name: str) -> VHost | None:
        text = await self._read(lambda: self._conn.client.hget(self._keys.vhosts, name))
        return None if text is None else loads(VHost, text)

    async def add_vhost(self, vhost: VHost) -> None:
        async def body(view: TopologyView) -> None:
            if await view.vhost(vhost.name) is None:
                view.create_vhost(vhost)

        await self._transact(body)

    async def update_vhost(self, vhost: VHost) -> None:
        async def body(view: TopologyView) -> None:
            state = await view.vhost(vhost.name)
            if state is None:
                raise vhost_not_found(vhost.name)
            if state.vhost == vhost:
                return
            view.tx.write("HSET", self._keys.vhosts, vhost.name, dumps(vhost))
            view.tx.publish([change("vhost.updated", vhost)])

        await self._transact(body)

    async def delete_vhost(self, name: str) -> Deletions:
        async def body(view: TopologyView) -> Deletions:
            await view.whole_vhost(name)
            state = view.state.vhosts.get(name)
            if state is None:
                return Deletions()
            deletions = view.state.delete_vhost(name)
            view.write_deletions(deletions)
            dropped: list[Any] = await self._records_of_vhost(view.tx, name)
            keys = self._keys
            limits = await view.tx.hget(keys.vhost_limits, name)
            if limits is not None:
                dropped.append(loads(VHostLimits, limits))
                view.tx.write("HDEL", keys.vhost_limits, name)
            view.tx.write("DEL", keys.exchange_index(name), keys.queue_index(name))
            view.tx.write("DEL", keys.connections(name))
            view.tx.write("HDEL", keys.vhosts, name)
            view.tx.publish(vhost_deleted_changes(state.vhost, deletions, dropped))
            return deletions

        return await self._transact(body)

    # --- exchanges ---

    async def declare_exchange(self, definition: ExchangeDef, passive: bool = False) -> ExchangeDef:
        async def body(view: TopologyView) -> ExchangeDef:
            await view.exchange(definition.vhost, definition.name)
            exchange, created = view.state.declare_exchange(definition, passive)
            if created:
                view.write_exchange(exchange)
                view.tx.publish([change("exchange.declared", exchange)])
            return exchange

        return await self._transact(body)

    async def get_exchange(self, vhost: str, name: str) -> ExchangeDef | None:
        key = self._keys.exchange(vhost, name)
        text = await self._read(lambda: self._conn.client.get(key))
        return None if text is None else loads(ExchangeDef, text)

    async def list_exchanges(self, vhost: str) -> list[ExchangeDef]:
        index, prefix = self._keys.exchange_index(vhost), self._keys.exchange(vhost, "")
        texts = await self._list(vhost, index, prefix, "get")
        return sorted((loads(ExchangeDef, t) for t in texts), key=lambda x: x.name)

    async def delete_exchange(self, vhost: str, name: str, if_unused: bool = False) -> Deletions:
        checks.check_exchange_deletion(vhost, name)  # before reading amq.*'s many bindings

        async def body(view: TopologyView) -> Deletions:
            await view.removal_closure(vhost, [("exchange", name)])
            return self._removed(view, view.state.delete_exchange(vhost, name, if_unused))

        return await self._transact(body)

    def _removed(self, view: TopologyView, deletions: Deletions) -> Deletions:
        view.write_deletions(deletions)
        view.tx.publish(deletion_changes(deletions))
        return deletions

    # --- queues ---

    async def declare_queue(
        self, definition: QueueDef, passive: bool = False, connection_id: str | None = None
    ) -> QueueDef:
        async def body(view: TopologyView) -> QueueDef:
            if await view.vhost(definition.vhost) is None:
                raise vhost_not_found(definition.vhost)
            # Server-named (""): a fresh random name, never there yet.
            missing = definition.name == "" or not await view.queue(
                definition.vhost, definition.name
            )
            room = None
            if missing and not passive:
                room = await self._queue_limit(view, definition.vhost)
                await view.reserve_queue_id()
            queue, created = view.state.declare_queue(definition, passive, connection_id, room)
            if created:
                view.write_queue(queue)
                view.tx.publish([change("queue.declared", queue)])
            return queue

        return await self._transact(body)

    async def get_queue(self, vhost: str, name: str) -> QueueDef | None:
        key = self._keys.queue(vhost, name)
        text = await self._read(lambda: self._conn.client.get(key))
        return None if text is None else loads(QueueDef, text)

    async def list_queues(self, vhost: str) -> list[QueueDef]:
        index, prefix = self._keys.queue_index(vhost), self._keys.queue(vhost, "")
        texts = await self._list(vhost, index, prefix, "get")
        return sorted((loads(QueueDef, t) for t in texts), key=lambda q: q.name)

    async def delete_queue(
        self,
        vhost: str,
        name: str,
        connection_id: str | None = None,
        check_exclusive: bool = True,
    ) -> Deletions:
        async def body(view: TopologyView) -> Deletions:
            await view.removal_closure(vhost, [("queue", name)])
            deletions = view.state.delete_queue(vhost, name, connection_id, check_exclusive)
            return self._removed(view, deletions)

        return await self._transact(body)

    async def delete_exclusive_queues(self, owner: str) -> Deletions:
        owner_key = self._keys.owner(owner)

        async def body(view: TopologyView) -> Deletions:
            for member in await view.tx.smembers(owner_key):
                vhost, name = parse_key(member)
                await view.removal_closure(vhost, [("queue", name)])
            deletions = view.state.delete_exclusive_queues(owner)
            view.tx.write("DEL", owner_key)
            return self._removed(view, deletions)

        return await self._transact(body)

    # --- bindings ---

    async def bind(
        self,
        binding: BindingDef,
        connection_id: str | None = None,
        check_exclusive: bool = True,
    ) -> bool:
        async def body(view: TopologyView) -> bool:
            await view.exchange(binding.vhost, binding.source)
            if binding.destination_type == "queue":
                await view.queue(binding.vhost, binding.destination)
            else:
                await view.exchange(binding.vhost, binding.destination)
            await view.stored_binding(binding, watch=False)
            if not view.state.bind(binding, connection_id, check_exclusive):
                return False
            view.write_binding(binding)
            # A racing identical bind is not watched (binds to one exchange would all
            # conflict); HSETNX decides which of them created it. The loser's feed entry
            # repeats an existing binding, which followers apply idempotently.
            view.tx.publish([change("binding.added", binding)])
            return bool((await view.tx.commit())[0])

        return await self._transact(body)

    async def unbind(
        self,
        binding: BindingDef,
        connection_id: str | None = None,
        check_exclusive: bool = True,
    ) -> Deletions:
        async def body(view: TopologyView) -> Deletions:
            source = await view.exchange(binding.vhost, binding.source)
            if binding.destination_type == "queue":
                await view.queue(binding.vhost, binding.destination)
            if source is not None and source.auto_delete:  # it may go with its last binding
                await view.removal_closure(binding.vhost, [("exchange", source.name)])
            else:
                await view.stored_binding(binding, watch=True)
            deletions = view.state.unbind(binding, connection_id, check_exclusive)
            return self._removed(view, deletions)

        return await self._transact(body)

    async def list_bindings(self, vhost: str) -> list[BindingDef]:
        index, prefix = self._keys.exchange_index(vhost), self._keys.outgoing(vhost, "")
        texts = await self._list(vhost, index, prefix, "hvals")
        return sorted((loads(BindingDef, t) for t in texts), key=_binding_order)

    async def bindings_for(self, vhost: str, source: str) -> list[BindingDef]:
        async def read() -> tuple[bool, list[str]]:
            async with self._conn.client.pipeline(transaction=True) as pipe:
                pipe.hexists(self._keys.vhosts, vhost)
                pipe.hvals(self._keys.outgoing(vhost, source))
                exists, texts = await pipe.execute()
            return bool(exists), list(texts)

        exists, texts = await self._read(read)
        if not exists:
            raise vhost_not_found(vhost)
        return sorted((loads(BindingDef, t) for t in texts), key=_binding_order)

    # --- users (the rest of the records are in RecordsMixin) ---

    async def authenticate(self, name: str, password: str) -> User | None:
        user = await self.get_user(name)
        return user if user is not None and user.accepts(password) else None

    # --- change feed ---

    async def change_position(self) -> str:
        return await self._read(lambda: current_position(self._conn, self._keys.changes))

    def follow(self, last_id: str | None = None) -> AsyncGenerator[ChangeEvent, None]:
        return follow_changes(self._conn, self._keys.changes, last_id)

    async def retry_write(self) -> None:
        """Nothing is held back here: Redis keeps its own durability."""

    async def close(self) -> None:
        await self._conn.close()


def _binding_order(binding: BindingDef) -> tuple[str, str, str, str]:
    return (binding.source, binding.destination_type, binding.destination, binding.routing_key)
