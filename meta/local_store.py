"""LocalMetadataStore: the embedded node's metadata, in memory plus one JSON file.

Durable exchanges and queues, bindings between durable ends, vhosts, users and
permissions are written to ``<data_dir>/metadata.json`` after every change that
touches them: write a temp file, fsync, os.replace, fsync the directory, so a crash
leaves either the old or the new file. Transient entities live in memory only.

Writes are group-committed: concurrent mutations share one write, and snapshots
are taken under a lock so an older snapshot never replaces a newer one.
Queue ids come from a counter persisted in blocks ahead of use, so an id is never
handed out twice, even across crashes and even for transient queues.

Every change is also published, in memory, to the change feed (meta.change_feed): followers
are in this process, so ids restart with it and nothing of the feed is persisted.

A full disk (ENOSPC, EDQUOT) does not fail a change: it stays in memory, the failure is
logged once, and ``retry_write`` (the node's housekeeping, every second) writes it once
space returns. A crash before then forgets it, as if it had not been made. (Should a queue
id from an unwritten block be handed out again after such a crash, the log store still
never gives the new queue an old record: each queue's ``created_at`` guards that.)
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from meta.change_feed import (
    ChangeEvent,
    change,
    deletion_changes,
    vhost_added_changes,
    vhost_deleted_changes,
)
from meta.errors import queue_not_found
from meta.local_records import LocalRecordsMixin
from meta.models import (
    BindingDef,
    ConsumptionControl,
    Deletions,
    ExchangeDef,
    GrayEnd,
    Permission,
    Policy,
    QueueDef,
    VHost,
    VHostLimits,
)
from meta.queue_route import QueueRoute
from meta.vhost_limits import MAX_QUEUES, limit_of


class LocalMetadataStore(LocalRecordsMixin):
    """The MetadataStore of an embedded node. Construct once; it loads synchronously.

    State and persistence: meta.local_base; users, permissions, policies, limits, gray rules
    and controls: meta.local_records; the topology, gray ends and routes: here."""

    # --- vhosts ---

    async def list_vhosts(self) -> list[VHost]:
        return [s.vhost for s in self._state.vhosts.values()]

    async def get_vhost(self, name: str) -> VHost | None:
        state = self._state.vhosts.get(name)
        return state.vhost if state else None

    async def add_vhost(self, vhost: VHost) -> None:
        created = self._state.add_vhost(vhost)
        if created:
            exchanges = self._state.vhosts[vhost.name].exchanges.values()
            self._feed.publish(vhost_added_changes(vhost, exchanges))
        await self._commit_if(created)

    async def update_vhost(self, vhost: VHost) -> None:
        state = self._state.vhost(vhost.name)
        if state.vhost == vhost:
            return
        state.vhost = vhost
        self._feed.publish([change("vhost.updated", vhost)])
        await self._commit()

    async def delete_vhost(self, name: str) -> Deletions:
        state = self._state.vhosts.get(name)
        deletions = self._state.delete_vhost(name)
        self._drop_with_queues(deletions.queues)
        dropped: list[Permission | Policy | ConsumptionControl | VHostLimits] = []
        records = self._records
        for key in [k for k in records.permissions if k[1] == name]:
            dropped.append(records.permissions.pop(key))
        for key in [k for k in records.policies if k[0] == name]:
            dropped.append(records.policies.pop(key))
        for control_key in [k for k in records.controls if k[0] == "queue" and k[1] == name]:
            dropped.append(records.controls.pop(control_key))
        if name in records.vhost_limits:
            dropped.append(records.vhost_limits.pop(name))
        self._connections.forget_vhost(name)
        if state is not None:
            self._feed.publish(vhost_deleted_changes(state.vhost, deletions, dropped))
        await self._commit_if(bool(deletions))
        return deletions

    # --- queues whose gray release ended ---

    async def set_gray_end(self, end: GrayEnd) -> None:
        if await self.get_queue(end.vhost, end.queue) is None:
            raise queue_not_found(end.vhost, end.queue)
        self._records.gray_ends[(end.vhost, end.queue)] = end
        self._feed.publish([change("gray_end.set", end)])
        await self._commit()

    async def delete_gray_end(self, vhost: str, queue: str) -> bool:
        end = self._records.gray_ends.pop((vhost, queue), None)
        if end is None:
            return False
        self._feed.publish([change("gray_end.deleted", end)])
        await self._commit()
        return True

    async def get_gray_end(self, vhost: str, queue: str) -> GrayEnd | None:
        return self._records.gray_ends.get((vhost, queue))

    async def list_gray_ends(self) -> list[GrayEnd]:
        return [self._records.gray_ends[key] for key in sorted(self._records.gray_ends)]

    # --- versioned routes of keyed-order queues (meta/local_routes.py) ---

    async def get_route(self, vhost: str, queue: str) -> QueueRoute | None:
        return self._routes.get(vhost, queue)

    async def set_route(self, route: QueueRoute, expected: QueueRoute | None) -> None:
        self._routes.compare_and_set(route, expected)
        self._feed.publish([change("route.set", route)])
        await self._commit()

    # --- exchanges ---

    async def declare_exchange(self, definition: ExchangeDef, passive: bool = False) -> ExchangeDef:
        exchange, created = self._state.declare_exchange(definition, passive)
        if created:
            self._feed.publish([change("exchange.declared", exchange)])
        await self._commit_if(created and exchange.durable)
        return exchange

    async def get_exchange(self, vhost: str, name: str) -> ExchangeDef | None:
        state = self._state.vhosts.get(vhost)
        return state.exchanges.get(name) if state else None

    async def list_exchanges(self, vhost: str) -> list[ExchangeDef]:
        return list(self._state.vhost(vhost).exchanges.values())

    async def delete_exchange(self, vhost: str, name: str, if_unused: bool = False) -> Deletions:
        return await self._removed(self._state.delete_exchange(vhost, name, if_unused))

    async def _removed(self, deletions: Deletions) -> Deletions:
        """Publish what a removal took away (cascades included) and persist it if durable.
        (A transient queue's gray end or route may stay in the file: loading skips it.)"""
        self._drop_with_queues(deletions.queues)
        self._feed.publish(deletion_changes(deletions))
        await self._commit_if(deletions.touches_durable)
        return deletions

    # --- queues ---

    async def declare_queue(
        self, definition: QueueDef, passive: bool = False, connection_id: str | None = None
    ) -> QueueDef:
        limit = limit_of(self._records.vhost_limits.get(definition.vhost), MAX_QUEUES)
        state = self._state.vhosts.get(definition.vhost)
        room = None if limit is None or state is None else (limit, len(state.queues))
        queue, created = self._state.declare_queue(definition, passive, connection_id, room)
        if created:
            self._feed.publish([change("queue.declared", queue)])
        await self._commit_if(created and queue.durable)
        return queue

    async def get_queue(self, vhost: str, name: str) -> QueueDef | None:
        state = self._state.vhosts.get(vhost)
        return state.queues.get(name) if state else None

    async def list_queues(self, vhost: str) -> list[QueueDef]:
        return list(self._state.vhost(vhost).queues.values())

    async def delete_queue(
        self,
        vhost: str,
        name: str,
        connection_id: str | None = None,
        check_exclusive: bool = True,
    ) -> Deletions:
        deletions = self._state.delete_queue(vhost, name, connection_id, check_exclusive)
        return await self._removed(deletions)

    async def delete_exclusive_queues(self, owner: str) -> Deletions:
        return await self._removed(self._state.delete_exclusive_queues(owner))

    # --- bindings ---

    async def bind(
        self,
        binding: BindingDef,
        connection_id: str | None = None,
        check_exclusive: bool = True,
    ) -> bool:
        created = self._state.bind(binding, connection_id, check_exclusive)
        if created:
            self._feed.publish([change("binding.added", binding)])
        state = self._state.vhost(binding.vhost)
        await self._commit_if(created and state.is_durable_binding(binding))
        return created

    async def unbind(
        self,
        binding: BindingDef,
        connection_id: str | None = None,
        check_exclusive: bool = True,
    ) -> Deletions:
        deletions = self._state.unbind(binding, connection_id, check_exclusive)
        return await self._removed(deletions)

    async def list_bindings(self, vhost: str) -> list[BindingDef]:
        state = self._state.vhost(vhost)
        return [b for group in state.by_source.values() for b in group.values()]

    async def bindings_for(self, vhost: str, source: str) -> list[BindingDef]:
        return list(self._state.vhost(vhost).by_source.get(source, {}).values())

    # --- change feed (in memory: followers are in this process) ---

    async def change_position(self) -> str:
        return self._feed.position()

    def follow(self, last_id: str | None = None) -> AsyncGenerator[ChangeEvent, None]:
        return self._feed.follow(last_id)

    async def close(self) -> None:
        await self._commit_if(False)
