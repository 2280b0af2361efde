"""In-memory metadata with RabbitMQ's semantics; no I/O, no awaiting.

``MetadataState`` is the single source of truth for the local store (which adds
persistence) and can back other stores' tests. Every mutating method returns what
changed so the caller knows whether durable state moved (and must be persisted).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from meta import checks
from meta.errors import (
    CommandInvalid,
    PreconditionFailed,
    exchange_not_found,
    queue_not_found,
    resource_name,
    vhost_not_found,
)
from meta.models import (
    BUILTIN_EXCHANGE_TYPES,
    DELAYED_MESSAGE_EXCHANGE_TYPE,
    PREDECLARED_EXCHANGES,
    BindingDef,
    Deletions,
    ExchangeDef,
    QueueDef,
    VHost,
)
from meta.queue_arguments import check_queue_arguments
from meta.vhost_limits import queue_limit_reached

BindingIdentity = tuple[str, str, str, str, Any]
Endpoint = tuple[str, str]  # (destination_type, name)


@dataclass
class VHostState:
    vhost: VHost
    exchanges: dict[str, ExchangeDef] = field(default_factory=dict)
    queues: dict[str, QueueDef] = field(default_factory=dict)
    by_source: dict[str, dict[BindingIdentity, BindingDef]] = field(default_factory=dict)
    by_destination: dict[Endpoint, dict[BindingIdentity, BindingDef]] = field(default_factory=dict)

    def is_durable_binding(self, binding: BindingDef) -> bool:
        source = self.exchanges.get(binding.source)
        dest: ExchangeDef | QueueDef | None = (
            self.queues.get(binding.destination)
            if binding.destination_type == "queue"
            else self.exchanges.get(binding.destination)
        )
        return bool(source and source.durable and dest and dest.durable)


def server_generated_queue_name(prefix: str = "amq.gen") -> str:
    """rabbit_guid:binary(gen_secure(), "amq.gen"): prefix-<base64url of 16 bytes>."""
    token = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode("ascii")
    return f"{prefix}-{token}"


def augment_queue_arguments(definition: QueueDef) -> QueueDef:
    """Apply what RabbitMQ's queue.declare does before comparing/storing.

    x-name-prefix is stripped, a missing x-queue-type becomes 'classic'
    (augment_declare_args/5), and exclusive queues are never durable.
    """
    arguments = {k: v for k, v in definition.arguments.items() if k != "x-name-prefix"}
    types = {k: v for k, v in definition.argument_types.items() if k in arguments}
    if checks.QUEUE_TYPE_ARG not in arguments:
        arguments[checks.QUEUE_TYPE_ARG] = checks.DEFAULT_QUEUE_TYPE
        types[checks.QUEUE_TYPE_ARG] = "longstr"
    durable = definition.durable and definition.exclusive_owner is None
    return definition.model_copy(
        update={"arguments": arguments, "argument_types": types, "durable": durable}
    )


class MetadataState:
    """Exchanges, queues and bindings of all vhosts (users live in the store)."""

    def __init__(
        self,
        allocate_queue_id: Callable[[], int],
        exchange_types: Iterable[str] = BUILTIN_EXCHANGE_TYPES,
        max_topic_hash_wildcards: int | None = checks.MAX_TOPIC_HASH_WILDCARDS,
    ) -> None:
        self.vhosts: dict[str, VHostState] = {}
        self.exchange_types = frozenset(exchange_types)
        self.max_topic_hash_wildcards = max_topic_hash_wildcards
        self._allocate_queue_id = allocate_queue_id

    def vhost(self, name: str) -> VHostState:
        state = self.vhosts.get(name)
        if state is None:
            raise vhost_not_found(name)
        return state

    # --- vhosts ---

    def add_vhost(self, vhost: VHost) -> bool:
        if vhost.name in self.vhosts:
            return False
        state = VHostState(vhost)
        for name, type_, internal in PREDECLARED_EXCHANGES:
            state.exchanges[name] = ExchangeDef(
                vhost=vhost.name, name=name, type=type_, durable=True, internal=internal
            )
        self.vhosts[vhost.name] = state
        return True

    def delete_vhost(self, name: str) -> Deletions:
        state = self.vhosts.pop(name, None)
        if state is None:
            return Deletions()
        bindings = [b for group in state.by_source.values() for b in group.values()]
        return Deletions(
            exchanges=tuple(state.exchanges.values()),
            queues=tuple(state.queues.values()),
            bindings=tuple(bindings),
            touches_durable=True,
        )

    def restore(
        self,
        exchanges: Iterable[ExchangeDef],
        queues: Iterable[QueueDef],
        bindings: Iterable[BindingDef],
    ) -> None:
        """Reinstall persisted entities as they were (no checks, ids kept)."""
        for exchange in exchanges:
            self.vhost(exchange.vhost).exchanges[exchange.name] = exchange
        for queue in queues:
            self.vhost(queue.vhost).queues[queue.name] = queue
        for binding in bindings:
            state = self.vhost(binding.vhost)
            state.by_source.setdefault(binding.source, {})[binding.identity] = binding
            endpoint = (binding.destination_type, binding.destination)
            state.by_destination.setdefault(endpoint, {})[binding.identity] = binding

    # --- exchanges ---

    def declare_exchange(self, definition: ExchangeDef, passive: bool) -> tuple[ExchangeDef, bool]:
        """Returns (the stored exchange, whether it was created)."""
        state = self.vhost(definition.vhost)
        if passive:
            checks.check_not_default_exchange(definition.name)
            existing = state.exchanges.get(definition.name)
            if existing is None:
                raise exchange_not_found(definition.vhost, definition.name)
            return existing, False
        if definition.type not in self.exchange_types:
            # rabbit_exchange:check_type/1: a connection error, not a channel one.
            raise CommandInvalid(f"unknown exchange type '{definition.type}'")
        checks.check_not_default_exchange(definition.name)
        existing = state.exchanges.get(definition.name)
        if existing is not None:
            checks.assert_exchange_equivalent(existing, definition)
            return existing, False
        checks.check_name_not_reserved("exchange", definition.name)
        resource = resource_name("exchange", definition.name, definition.vhost)
        checks.check_exchange_name_arg(
            definition.arguments, definition.argument_types, "alternate-exchange", resource
        )
        if definition.type == DELAYED_MESSAGE_EXCHANGE_TYPE:
            checks.check_delayed_exchange(definition)  # the plugin's validate/1, on creation
        state.exchanges[definition.name] = definition
        return definition, True

    def delete_exchange(self, vhost: str, name: str, if_unused: bool) -> Deletions:
        checks.check_exchange_deletion(vhost, name)
        state = self.vhost(vhost)
        exchange = state.exchanges.get(name)
        if exchange is None:
            return Deletions()
        if if_unused and state.by_source.get(name):
            raise PreconditionFailed(f"{resource_name('exchange', name, vhost)} in use")
        removed = _Removed()
        self._remove_exchange(state, exchange, removed)
        return removed.freeze()

    def _remove_exchange(self, state: VHostState, exchange: ExchangeDef, removed: _Removed) -> None:
        if exchange.name in removed.exchanges_in_progress:
            return  # reached again through an auto-delete cascade
        removed.exchanges_in_progress.add(exchange.name)
        # Bindings go first, while both ends are still known (their durability counts).
        for binding in list(state.by_source.get(exchange.name, {}).values()):
            self._remove_binding(state, binding, removed, auto_delete=False)
        self._remove_bindings_to(state, ("exchange", exchange.name), removed)
        del state.exchanges[exchange.name]
        removed.exchanges.append(exchange)

    # --- queues ---

    def declare_queue(
        self,
        definition: QueueDef,
        passive: bool,
        connection_id: str | None,
        queue_limit: tuple[int, int] | None = None,
    ) -> tuple[QueueDef, bool]:
        """``queue_limit``: (max-queues, queues in the vhost now), when the vhost has one."""
        state = self.vhost(definition.vhost)
        if passive:
            existing = state.queues.get(definition.name)
            if existing is None:
                raise queue_not_found(definition.vhost, definition.name)
            checks.check_exclusive_access(existing, connection_id)
            return existing, False
        requested = augment_queue_arguments(definition)
        if requested.name == "":
            queue_type = checks.queue_type_of(requested)
            if queue_type != checks.DEFAULT_QUEUE_TYPE:
                raise PreconditionFailed(
                    f"Cannot declare a server-named queue for type rabbit_{queue_type}_queue"
                )
            requested = requested.model_copy(update={"name": server_generated_queue_name()})
        else:
            checks.check_name_not_reserved("queue", requested.name)
        existing = state.queues.get(requested.name)
        if existing is not None:
            checks.assert_queue_equivalent(existing, requested)
            return existing, False
        resource = resource_name("queue", requested.name, requested.vhost)
        checks.check_exchange_name_arg(
            requested.arguments, requested.argument_types, "x-dead-letter-exchange", resource
        )
        check_queue_arguments(requested)  # on creation only, as rabbit_amqqueue:declare does
        if queue_limit is not None and queue_limit[1] >= queue_limit[0]:
            raise queue_limit_reached(requested.vhost, requested.name, queue_limit[0])
        created = requested.model_copy(update={"queue_id": self._allocate_queue_id()})
        state.queues[created.name] = created
        return created, True

    def delete_queue(
        self, vhost: str, name: str, connection_id: str | None, check_exclusive: bool
    ) -> Deletions:
        state = self.vhost(vhost)
        queue = state.queues.get(name)
        if queue is None:
            return Deletions()
        if check_exclusive:
            checks.check_exclusive_access(queue, connection_id)
        removed = _Removed()
        self._remove_queue(state, queue, removed)
        return removed.freeze()

    def delete_exclusive_queues(self, owner: str) -> Deletions:
        removed = _Removed()
        for state in self.vhosts.values():
            for queue in [q for q in state.queues.values() if q.exclusive_owner == owner]:
                self._remove_queue(state, queue, removed)
        return removed.freeze()

    def _remove_queue(self, state: VHostState, queue: QueueDef, removed: _Removed) -> None:
        self._remove_bindings_to(state, ("queue", queue.name), removed)
        del state.queues[queue.name]
        removed.queues.append(queue)

    # --- bindings ---

    def bind(self, binding: BindingDef, connection_id: str | None, check_exclusive: bool) -> bool:
        state = self.vhost(binding.vhost)
        self._check_binding_ends_not_default(binding)
        source = state.exchanges.get(binding.source)
        if source is None:
            raise exchange_not_found(binding.vhost, binding.source)
        destination = self._destination(state, binding)
        checks.validate_binding(
            source, binding, max_topic_hash_wildcards=self.max_topic_hash_wildcards
        )
        if check_exclusive and isinstance(destination, QueueDef):
            checks.check_exclusive_access(destination, connection_id)
        identity = binding.identity
        group = state.by_source.setdefault(binding.source, {})
        if identity in group:
            return False
        group[identity] = binding
        endpoint = (binding.destination_type, binding.destination)
        state.by_destination.setdefault(endpoint, {})[identity] = binding
        return True

    def unbind(
        self, binding: BindingDef, connection_id: str | None, check_exclusive: bool
    ) -> Deletions:
        state = self.vhost(binding.vhost)
        self._check_binding_ends_not_default(binding)
        group = state.by_source.get(binding.source, {})
        stored = group.get(binding.identity)
        if stored is None:  # unknown binding or missing ends: RabbitMQ says ok
            return Deletions()
        destination = state.queues.get(binding.destination)
        if check_exclusive and binding.destination_type == "queue" and destination is not None:
            checks.check_exclusive_access(destination, connection_id)
        removed = _Removed()
        self._remove_binding(state, stored, removed, auto_delete=True)
        return removed.freeze()

    @staticmethod
    def _check_binding_ends_not_default(binding: BindingDef) -> None:
        if binding.destination_type == "exchange":
            checks.check_not_default_exchange(binding.destination)
        checks.check_not_default_exchange(binding.source)

    @staticmethod
    def _destination(state: VHostState, binding: BindingDef) -> ExchangeDef | QueueDef:
        if binding.destination_type == "queue":
            queue = state.queues.get(binding.destination)
            if queue is None:
                raise queue_not_found(binding.vhost, binding.destination)
            return queue
        exchange = state.exchanges.get(binding.destination)
        if exchange is None:
            raise exchange_not_found(binding.vhost, binding.destination)
        return exchange

    def _remove_bindings_to(self, state: VHostState, endpoint: Endpoint, removed: _Removed) -> None:
        for binding in list(state.by_destination.get(endpoint, {}).values()):
            self._remove_binding(state, binding, removed, auto_delete=True)
        state.by_destination.pop(endpoint, None)

    def _remove_binding(
        self, state: VHostState, binding: BindingDef, removed: _Removed, auto_delete: bool
    ) -> None:
        identity = binding.identity
        group = state.by_source.get(binding.source)
        if group is None or group.pop(identity, None) is None:
            return  # already removed by an earlier step of the cascade
        removed.bindings.append(binding)
        removed.durable_bindings |= state.is_durable_binding(binding)
        if not group:
            del state.by_source[binding.source]
        endpoint = (binding.destination_type, binding.destination)
        targets = state.by_destination.get(endpoint)
        if targets is not None:
            targets.pop(identity, None)
            if not targets:
                del state.by_destination[endpoint]
        source = state.exchanges.get(binding.source)
        # An auto-delete exchange goes when its last outgoing binding does.
        if auto_delete and source is not None and source.auto_delete and not group:
            self._remove_exchange(state, source, removed)


@dataclass
class _Removed:
    exchanges: list[ExchangeDef] = field(default_factory=list)
    queues: list[QueueDef] = field(default_factory=list)
    bindings: list[BindingDef] = field(default_factory=list)
    exchanges_in_progress: set[str] = field(default_factory=set)
    durable_bindings: bool = False

    def freeze(self) -> Deletions:
        return Deletions(
            exchanges=tuple(self.exchanges),
            queues=tuple(self.queues),
            bindings=tuple(self.bindings),
            touches_durable=self.durable_bindings
            or any(x.durable for x in self.exchanges)
            or any(q.durable for q in self.queues),
        )
