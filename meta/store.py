"""The metadata store interface: one Protocol, several implementations.

Implementations: ``LocalMetadataStore`` (embedded node, JSON file) and
``RedisMetadataStore`` (cluster; meta.redis_store). Both pass the same contract suite
(tests/meta/test_meta_contract.py). Methods are async so a networked store fits; errors are
the typed ones in meta.errors with RabbitMQ's texts (and ``MetadataUnavailable`` when Redis
cannot be reached in time). Mutations that remove things return ``Deletions`` (cascades
included) so callers can update their routing caches incrementally; every mutation also
appends ``Change`` items to the store's change feed (meta.change_feed), which is how caches
of other gateways follow. Cluster-only calls (leases, brokers, placement) are in
meta.cluster.ClusterRegistry.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

from meta.change_feed import ChangeEvent
from meta.models import (
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
from meta.queue_route import QueueRoute


class MetadataStore(Protocol):
    # --- vhosts ---
    async def list_vhosts(self) -> list[VHost]: ...
    async def get_vhost(self, name: str) -> VHost | None: ...
    async def add_vhost(self, vhost: VHost) -> None:
        """Create (idempotent) with the predeclared exchanges."""

    async def update_vhost(self, vhost: VHost) -> None:
        """Replace an existing vhost's description, tags and tracing flag (NotAllowed
        "vhost ... not found" if there is none)."""

    async def delete_vhost(self, name: str) -> Deletions: ...

    # --- policies ---
    async def put_policy(self, policy: Policy) -> None: ...
    async def delete_policy(self, vhost: str, name: str) -> bool: ...
    async def list_policies(self, vhost: str | None = None) -> list[Policy]: ...

    # --- vhost limits (meta.vhost_limits) ---
    async def set_vhost_limits(self, limits: VHostLimits) -> None:
        """Replace the vhost's limits (NotAllowed "vhost ... not found" if there is none).
        Deleting the vhost drops them."""

    async def get_vhost_limits(self, vhost: str) -> VHostLimits | None: ...
    async def list_vhost_limits(self) -> list[VHostLimits]: ...
    async def open_connection(
        self, vhost: str, connection_id: str, max_connections: int | None
    ) -> bool:
        """Count connection ``connection_id`` ("<gateway>/<n>") as open in ``vhost``, unless
        ``max_connections`` (None: no limit) are open there already: then False. Counted
        over every gateway sharing the store."""

    async def close_connection(self, vhost: str, connection_id: str) -> None: ...
    async def count_connections(self, vhost: str) -> int: ...
    async def forget_connections(self, gateway_id: str) -> None:
        """Stop counting every "<gateway_id>/<n>" connection (that gateway is gone)."""

    # --- consumption controls ---
    async def put_control(self, control: ConsumptionControl) -> None:
        """Create or replace the control of ``control.key``."""

    async def delete_control(self, scope: str, vhost: str, name: str) -> bool: ...
    async def list_controls(self) -> list[ConsumptionControl]: ...

    # --- gray release rules (gateway/features/gray.py) ---
    async def set_gray_rule(self, rule: GrayRule) -> None:
        """Create or replace the rule named ``rule.name``."""

    async def delete_gray_rule(self, name: str) -> bool:
        """False if there was no such rule."""

    async def get_gray_rule(self, name: str) -> GrayRule | None: ...
    async def list_gray_rules(self) -> list[GrayRule]:
        """Sorted by name."""

    # --- queues whose gray release ended (mqgw ctl gray end) ---
    async def set_gray_end(self, end: GrayEnd) -> None:
        """Create or replace the end of queue ``end.queue`` in ``end.vhost`` (NotFound if
        there is no such queue). It belongs to that queue: deleting the queue, or its vhost,
        drops it, and a queue declared again under the name has none."""

    async def delete_gray_end(self, vhost: str, queue: str) -> bool:
        """False if the queue's gray release had not ended."""

    async def get_gray_end(self, vhost: str, queue: str) -> GrayEnd | None: ...
    async def list_gray_ends(self) -> list[GrayEnd]:
        """Sorted by (vhost, queue)."""

    # --- versioned routes of keyed-order queues (meta/queue_route.py) ---
    async def get_route(self, vhost: str, queue: str) -> QueueRoute | None:
        """The route of the queue now named ``queue`` in ``vhost``; None if it has none (a
        route set for an earlier queue of that name is none)."""

    async def set_route(self, route: QueueRoute, expected: QueueRoute | None) -> None:
        """Compare-and-set: store ``route`` if the route stored now for (``route.vhost``,
        ``route.queue``) equals ``expected`` (None: there is none), else RouteConflict (409).
        NotFound if there is no such queue or its id is not ``route.queue_id``. Publishes
        ``route.set``. The route belongs to that queue: deleting the queue, or its vhost,
        drops it, and a queue declared again under the name has none."""

    # --- users and permissions ---
    async def list_users(self) -> list[User]: ...
    async def get_user(self, name: str) -> User | None: ...
    async def put_user(self, user: User) -> None:
        """Create or replace."""

    async def delete_user(self, name: str) -> bool:
        """Also drops the user's permissions. False if there was no such user."""

    async def authenticate(self, name: str, password: str) -> User | None: ...
    async def set_permission(self, permission: Permission) -> None: ...
    async def clear_permission(self, user: str, vhost: str) -> None: ...
    async def get_permission(self, user: str, vhost: str) -> Permission | None: ...
    async def list_permissions(self, vhost: str | None = None) -> list[Permission]: ...

    # --- exchanges ---
    async def declare_exchange(self, definition: ExchangeDef, passive: bool = False) -> ExchangeDef:
        """Create, or check equivalence with the existing one (which is returned)."""

    async def get_exchange(self, vhost: str, name: str) -> ExchangeDef | None: ...
    async def list_exchanges(self, vhost: str) -> list[ExchangeDef]: ...
    async def delete_exchange(self, vhost: str, name: str, if_unused: bool = False) -> Deletions:
        """Missing exchange: empty Deletions (RabbitMQ's ensure_deleted)."""

    # --- queues ---
    async def declare_queue(
        self, definition: QueueDef, passive: bool = False, connection_id: str | None = None
    ) -> QueueDef:
        """Create (name '' = server-named) or check equivalence; returns the stored queue.

        ``definition.exclusive_owner`` is the declaring connection when exclusive;
        ``connection_id`` is the declaring connection for the passive exclusivity check.
        """

    async def get_queue(self, vhost: str, name: str) -> QueueDef | None: ...
    async def list_queues(self, vhost: str) -> list[QueueDef]: ...
    async def delete_queue(
        self,
        vhost: str,
        name: str,
        connection_id: str | None = None,
        check_exclusive: bool = True,
    ) -> Deletions:
        """if-unused/if-empty are the caller's (it knows consumers and counts)."""

    async def delete_exclusive_queues(self, owner: str) -> Deletions:
        """Drop every queue exclusively owned by connection ``owner`` (it closed)."""

    # --- bindings ---
    async def bind(
        self,
        binding: BindingDef,
        connection_id: str | None = None,
        check_exclusive: bool = True,
    ) -> bool:
        """True if the binding is new, False if it already existed."""

    async def unbind(
        self,
        binding: BindingDef,
        connection_id: str | None = None,
        check_exclusive: bool = True,
    ) -> Deletions: ...
    async def list_bindings(self, vhost: str) -> list[BindingDef]: ...
    async def bindings_for(self, vhost: str, source: str) -> list[BindingDef]: ...

    # --- change feed ---
    async def change_position(self) -> str:
        """The id to follow from to see every change made after this call. To build a
        cache: take the position, load everything, then ``follow(position)``."""

    def follow(self, last_id: str | None = None) -> AsyncGenerator[ChangeEvent, None]:
        """Changes after ``last_id``, forever; ``Reload`` after a gap (meta.change_feed).

        ``last_id`` None starts at the follower's first read (the generator runs only when
        iterated): to miss nothing, take ``change_position()`` before loading the cache.
        Iterate it inside ``contextlib.aclosing`` so that leaving closes it."""

    async def retry_write(self) -> None:
        """Write what a full disk kept in memory (the node's housekeeping calls it every
        second). A store whose server keeps its own durability (Redis) has nothing to do."""

    async def close(self) -> None: ...
