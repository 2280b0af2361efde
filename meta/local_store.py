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

import json
import os
from collections.abc import AsyncGenerator, Iterable
from pathlib import Path

import anyio
import anyio.to_thread

from meta import checks
from meta.change_feed import (
    DEFAULT_LOCAL_FEED_LENGTH,
    ChangeEvent,
    MemoryChangeFeed,
    change,
    deletion_changes,
    vhost_added_changes,
    vhost_deleted_changes,
)
from meta.errors import queue_not_found, vhost_not_found
from meta.local_routes import LocalRoutes
from meta.metadata_file import MetadataFile
from meta.models import (
    BUILTIN_EXCHANGE_TYPES,
    DEFAULT_VHOST,
    PREDECLARED_EXCHANGES,
    BindingDef,
    ConsumptionControl,
    Deletions,
    ExchangeDef,
    GrayEnd,
    GrayRule,
    Permission,
    Policy,
    QueueDef,
    User,
    VHost,
    VHostLimits,
)
from meta.password import hash_password
from meta.queue_route import QueueRoute
from meta.serialization import dump as _dump
from meta.serialization import load as _load
from meta.state import MetadataState
from meta.vhost_limits import MAX_QUEUES, ConnectionCounts, LocalConnections, limit_of

FILE_NAME = "metadata.json"
FORMAT_VERSION = 1
QUEUE_ID_BLOCK = 1024
_PREDECLARED_NAMES = frozenset(name for name, _, _ in PREDECLARED_EXCHANGES)


class LocalMetadataStore(LocalConnections):
    """The MetadataStore of an embedded node. Construct once; it loads synchronously."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        exchange_types: Iterable[str] = BUILTIN_EXCHANGE_TYPES,
        max_topic_hash_wildcards: int | None = checks.MAX_TOPIC_HASH_WILDCARDS,
        default_user: bool = True,
        change_feed_max_len: int = DEFAULT_LOCAL_FEED_LENGTH,
    ) -> None:
        self._default_user = default_user
        self._feed = MemoryChangeFeed(change_feed_max_len)
        self._dir = Path(data_dir)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._path = self._dir / FILE_NAME
        self._users: dict[str, User] = {}
        self._permissions: dict[tuple[str, str], Permission] = {}
        self._policies: dict[tuple[str, str], Policy] = {}
        self._controls: dict[tuple[str, str, str], ConsumptionControl] = {}
        self._vhost_limits: dict[str, VHostLimits] = {}
        self._gray_rules: dict[str, GrayRule] = {}
        self._gray_ends: dict[tuple[str, str], GrayEnd] = {}  # (vhost, queue)
        self._connections = ConnectionCounts()  # in memory: connections end with the process
        self._next_queue_id = 1
        self._queue_id_reserved_until = 1  # ids below this may have been handed out
        self._state = MetadataState(
            self._allocate_queue_id, exchange_types, max_topic_hash_wildcards
        )
        self._routes = LocalRoutes(self._state)  # keyed-order queues' versioned routes
        self._version = 0
        self._persisted_version = 0
        self._persisted_queue_id_floor = 1
        self._write_lock = anyio.Lock()
        self._file = MetadataFile(self._path)  # on a full disk: in memory, see retry_write
        if self._path.exists():
            self._load_file()
        else:
            self._bootstrap()
            self._version = 1
            if self._file.write(self._snapshot()):
                self._persisted_version = 1
                self._persisted_queue_id_floor = self._queue_id_reserved_until

    # --- persistence ---

    def _bootstrap(self) -> None:
        """A fresh node: vhost '/', user guest/guest (administrator) with full rights, unless
        the configuration names its own users (RabbitMQ's default_user, first boot only)."""
        self._state.add_vhost(VHost(name=DEFAULT_VHOST))
        if not self._default_user:
            return
        self._users["guest"] = User(
            name="guest", password_hash=hash_password("guest"), tags=("administrator",)
        )
        self._permissions[("guest", DEFAULT_VHOST)] = Permission(user="guest", vhost=DEFAULT_VHOST)

    def _allocate_queue_id(self) -> int:
        if self._next_queue_id >= self._queue_id_reserved_until:
            # Reserve a block; the caller's mutation persists it before the id escapes.
            self._queue_id_reserved_until = self._next_queue_id + QUEUE_ID_BLOCK
        queue_id = self._next_queue_id
        self._next_queue_id += 1
        return queue_id

    def _snapshot(self) -> bytes:
        exchanges, queues, bindings = [], [], []
        for state in self._state.vhosts.values():
            exchanges += [
                _dump(x)
                for x in state.exchanges.values()
                if x.durable and x.name not in _PREDECLARED_NAMES
            ]
            queues += [_dump(q) for q in state.queues.values() if q.durable]
            bindings += [
                _dump(b)
                for group in state.by_source.values()
                for b in group.values()
                if state.is_durable_binding(b)
            ]
        document = {
            "format": FORMAT_VERSION,
            "queue_id_floor": self._queue_id_reserved_until,
            "vhosts": [_dump(s.vhost) for s in self._state.vhosts.values()],
            "users": [_dump(u) for u in self._users.values()],
            "permissions": [_dump(p) for p in self._permissions.values()],
            "policies": [_dump(p) for p in self._policies.values()],
            "controls": [_dump(c) for c in self._controls.values()],
            "vhost_limits": [_dump(v) for v in self._vhost_limits.values()],
            "gray_rules": [_dump(r) for r in self._gray_rules.values()],
            "gray_ends": [_dump(e) for e in self._gray_ends.values()],
            "routes": self._routes.dump(),
            "exchanges": exchanges,
            "queues": queues,
            "bindings": bindings,
        }
        return json.dumps(document, indent=1, sort_keys=True).encode("utf-8")

    def _load_file(self) -> None:
        document = json.loads(self._path.read_bytes())
        if document.get("format") != FORMAT_VERSION:
            raise ValueError(f"{self._path}: unsupported format {document.get('format')!r}")
        floor = int(document["queue_id_floor"])
        self._next_queue_id = self._queue_id_reserved_until = floor
        self._persisted_queue_id_floor = floor
        for data in document["vhosts"]:
            self._state.add_vhost(_load(VHost, data))
        for data in document["users"]:
            user = _load(User, data)
            self._users[user.name] = user
        for data in document.get("policies", []):
            policy = _load(Policy, data)
            self._policies[(policy.vhost, policy.name)] = policy
        for data in document.get("controls", []):
            control = _load(ConsumptionControl, data)
            self._controls[control.key] = control
        for data in document.get("vhost_limits", []):
            limits = _load(VHostLimits, data)
            self._vhost_limits[limits.vhost] = limits
        for data in document.get("gray_rules", []):  # absent from files before gray rules
            rule = _load(GrayRule, data)
            self._gray_rules[rule.name] = rule
        for data in document["permissions"]:
            permission = _load(Permission, data)
            self._permissions[(permission.user, permission.vhost)] = permission
        self._state.restore(
            [_load(ExchangeDef, d) for d in document["exchanges"]],
            [_load(QueueDef, d) for d in document["queues"]],
            [_load(BindingDef, d) for d in document["bindings"]],
        )
        for data in document.get("gray_ends", []):  # absent from files before gray ends
            end = _load(GrayEnd, data)
            state = self._state.vhosts.get(end.vhost)
            if state is not None and end.queue in state.queues:  # not a transient one, gone
                self._gray_ends[(end.vhost, end.queue)] = end
        self._routes.load(document.get("routes", []))  # absent from files before routes

    async def _commit(self) -> None:
        """Persist everything up to now; returns once it is durable on disk (on a full disk:
        once it is kept in memory for ``retry_write``)."""
        self._version += 1
        target = self._version
        async with self._write_lock:
            if self._persisted_version >= target:
                return  # another writer's snapshot already contained our change
            version, floor = self._version, self._queue_id_reserved_until
            payload = self._snapshot()
            if await anyio.to_thread.run_sync(self._file.write, payload):
                self._persisted_version, self._persisted_queue_id_floor = version, floor

    async def retry_write(self) -> None:
        """Write what a full disk kept in memory (cheap when everything is on disk)."""
        if self._persisted_version < self._version:
            await self._commit()

    async def _commit_if(self, durable_changed: bool) -> None:
        # A new queue-id block must be on disk before any id from it is handed out.
        if durable_changed or self._queue_id_reserved_until > self._persisted_queue_id_floor:
            await self._commit()

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
        for key in [k for k in self._permissions if k[1] == name]:
            dropped.append(self._permissions.pop(key))
        for key in [k for k in self._policies if k[0] == name]:
            dropped.append(self._policies.pop(key))
        for control_key in [k for k in self._controls if k[0] == "queue" and k[1] == name]:
            dropped.append(self._controls.pop(control_key))
        if name in self._vhost_limits:
            dropped.append(self._vhost_limits.pop(name))
        self._connections.forget_vhost(name)
        if state is not None:
            self._feed.publish(vhost_deleted_changes(state.vhost, deletions, dropped))
        await self._commit_if(bool(deletions))
        return deletions

    # --- users and permissions ---

    async def list_users(self) -> list[User]:
        return list(self._users.values())

    async def get_user(self, name: str) -> User | None:
        return self._users.get(name)

    async def put_user(self, user: User) -> None:
        self._users[user.name] = user
        self._feed.publish([change("user.put", user)])
        await self._commit()

    async def delete_user(self, name: str) -> bool:
        user = self._users.pop(name, None)
        if user is None:
            return False
        dropped = [self._permissions.pop(k) for k in [k for k in self._permissions if k[0] == name]]
        self._feed.publish(
            [*(change("permission.cleared", p) for p in dropped), change("user.deleted", user)]
        )
        await self._commit()
        return True

    async def authenticate(self, name: str, password: str) -> User | None:
        user = self._users.get(name)
        return user if user is not None and user.accepts(password) else None

    async def set_permission(self, permission: Permission) -> None:
        if permission.vhost not in self._state.vhosts:
            raise vhost_not_found(permission.vhost)
        self._permissions[(permission.user, permission.vhost)] = permission
        self._feed.publish([change("permission.set", permission)])
        await self._commit()

    async def clear_permission(self, user: str, vhost: str) -> None:
        cleared = self._permissions.pop((user, vhost), None)
        if cleared is not None:
            self._feed.publish([change("permission.cleared", cleared)])
            await self._commit()

    async def get_permission(self, user: str, vhost: str) -> Permission | None:
        return self._permissions.get((user, vhost))

    async def list_permissions(self, vhost: str | None = None) -> list[Permission]:
        return [p for p in self._permissions.values() if vhost is None or p.vhost == vhost]

    # --- policies ---

    async def put_policy(self, policy: Policy) -> None:
        if policy.vhost not in self._state.vhosts:
            raise vhost_not_found(policy.vhost)
        self._policies[(policy.vhost, policy.name)] = policy
        self._feed.publish([change("policy.put", policy)])
        await self._commit()

    async def delete_policy(self, vhost: str, name: str) -> bool:
        policy = self._policies.pop((vhost, name), None)
        if policy is None:
            return False
        self._feed.publish([change("policy.deleted", policy)])
        await self._commit()
        return True

    async def list_policies(self, vhost: str | None = None) -> list[Policy]:
        return [p for p in self._policies.values() if vhost is None or p.vhost == vhost]

    # --- vhost limits ---

    async def set_vhost_limits(self, limits: VHostLimits) -> None:
        if limits.vhost not in self._state.vhosts:
            raise vhost_not_found(limits.vhost)
        self._vhost_limits[limits.vhost] = limits
        self._feed.publish([change("vhost_limits.set", limits)])
        await self._commit()

    async def get_vhost_limits(self, vhost: str) -> VHostLimits | None:
        return self._vhost_limits.get(vhost)

    async def list_vhost_limits(self) -> list[VHostLimits]:
        return sorted(self._vhost_limits.values(), key=lambda v: v.vhost)

    # --- gray release rules ---

    async def set_gray_rule(self, rule: GrayRule) -> None:
        self._gray_rules[rule.name] = rule
        self._feed.publish([change("gray_rule.set", rule)])
        await self._commit()

    async def delete_gray_rule(self, name: str) -> bool:
        rule = self._gray_rules.pop(name, None)
        if rule is None:
            return False
        self._feed.publish([change("gray_rule.deleted", rule)])
        await self._commit()
        return True

    async def get_gray_rule(self, name: str) -> GrayRule | None:
        return self._gray_rules.get(name)

    async def list_gray_rules(self) -> list[GrayRule]:
        return sorted(self._gray_rules.values(), key=lambda r: r.name)

    # --- queues whose gray release ended ---

    async def set_gray_end(self, end: GrayEnd) -> None:
        if await self.get_queue(end.vhost, end.queue) is None:
            raise queue_not_found(end.vhost, end.queue)
        self._gray_ends[(end.vhost, end.queue)] = end
        self._feed.publish([change("gray_end.set", end)])
        await self._commit()

    async def delete_gray_end(self, vhost: str, queue: str) -> bool:
        end = self._gray_ends.pop((vhost, queue), None)
        if end is None:
            return False
        self._feed.publish([change("gray_end.deleted", end)])
        await self._commit()
        return True

    async def get_gray_end(self, vhost: str, queue: str) -> GrayEnd | None:
        return self._gray_ends.get((vhost, queue))

    async def list_gray_ends(self) -> list[GrayEnd]:
        return [self._gray_ends[key] for key in sorted(self._gray_ends)]

    def _drop_with_queues(self, queues: Iterable[QueueDef]) -> None:
        """Deleted queues lose their gray end and route (no change of their own:
        queue.deleted says it)."""
        for q in queues:
            self._gray_ends.pop((q.vhost, q.name), None)
            self._routes.drop(q)

    # --- versioned routes of keyed-order queues (meta/local_routes.py) ---

    async def get_route(self, vhost: str, queue: str) -> QueueRoute | None:
        return self._routes.get(vhost, queue)

    async def set_route(self, route: QueueRoute, expected: QueueRoute | None) -> None:
        self._routes.compare_and_set(route, expected)
        self._feed.publish([change("route.set", route)])
        await self._commit()

    # --- consumption controls ---

    async def put_control(self, control: ConsumptionControl) -> None:
        self._controls[control.key] = control
        self._feed.publish([change("control.put", control)])
        await self._commit()

    async def delete_control(self, scope: str, vhost: str, name: str) -> bool:
        control = self._controls.pop((scope, vhost, name), None)
        if control is None:
            return False
        self._feed.publish([change("control.deleted", control)])
        await self._commit()
        return True

    async def list_controls(self) -> list[ConsumptionControl]:
        return list(self._controls.values())

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
        limit = limit_of(self._vhost_limits.get(definition.vhost), MAX_QUEUES)
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
