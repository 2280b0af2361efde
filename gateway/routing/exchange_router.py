"""Per-vhost routing: exchanges and bindings in memory, route() at publish time.

Follows rabbit_exchange:route/3: a work list of exchanges starting at the published-to
one; each exchange's own matches (queues and bound exchanges) are collected, each
exchange is visited at most once (so e2e cycles terminate), and an exchange whose own
match is empty hands the message to its ``alternate-exchange`` if that exists.
The default exchange ("") routes to the queue named by each routing key, if it exists.
Routing keys are the publish key followed by the CC and BCC header entries.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.routing.field_terms import Buffer
from gateway.routing.headers_match import HeadersMatcher, header_terms
from gateway.routing.topic_trie import TopicTrie
from meta.amqp_values import infer_type
from meta.errors import PreconditionFailed
from meta.models import (
    DEFAULT_EXCHANGE,
    DELAYED_MESSAGE_EXCHANGE_TYPE,
    BindingDef,
    Deletions,
    DestinationType,
    ExchangeDef,
)

Destination = tuple[DestinationType, str]
_ROUTING_HEADERS = ("CC", "BCC")
ROUTE_CACHE_SIZE = 4096  # routes kept per vhost (a change, or this many, empties it)


class UnknownExchange(KeyError):
    """route() on an exchange the router does not hold (the caller answers 404)."""


@dataclass(frozen=True, slots=True)
class RouteResult:
    queues: frozenset[str]
    exchanges_visited: tuple[str, ...]
    alternate_exchange_used: bool = False
    # x-delayed-message exchanges that hold the message instead of routing it now (route's
    # ``hold_delayed``); they route it themselves when it is due.
    held_by: tuple[str, ...] = ()
    ordered: tuple[str, ...] = ()  # ``queues`` sorted (a publish's destinations, in order)


def header_routing_keys(headers: Mapping[str, Any] | None) -> list[str]:
    """Extra routing keys from the CC then BCC headers (rabbit_basic:header_routes/1).

    Only string entries of an array count; any other header type is RabbitMQ's
    "invalid message" precondition failure.
    """
    if not headers:
        return []
    keys: list[str] = []
    for name in _ROUTING_HEADERS:
        if name not in headers:
            continue
        value = headers[name]
        if not isinstance(value, list | tuple):
            raise PreconditionFailed(
                f'invalid message: {{unacceptable_type_in_header,"{name}",{infer_type(value)}}}'
            )
        keys.extend(item for item in value if isinstance(item, str))
    return keys


def strip_bcc(headers: dict[str, Any] | None) -> dict[str, Any] | None:
    """Headers to store and deliver: BCC never reaches consumers."""
    if not headers or "BCC" not in headers:
        return headers
    return {key: value for key, value in headers.items() if key != "BCC"}


def _routing_type(exchange: ExchangeDef) -> str:
    if exchange.type == DELAYED_MESSAGE_EXCHANGE_TYPE:
        delayed = exchange.arguments.get("x-delayed-type")
        return delayed if isinstance(delayed, str) else "direct"
    return exchange.type


def _count_up(counts: dict[Destination, int], destination: Destination) -> None:
    counts[destination] = counts.get(destination, 0) + 1


def _count_down(counts: dict[Destination, int], destination: Destination) -> None:
    remaining = counts.get(destination, 0) - 1
    if remaining > 0:
        counts[destination] = remaining
    else:
        counts.pop(destination, None)


class _ExchangeRoutes:
    """One exchange's bindings, indexed the way its type matches them."""

    __slots__ = ("bindings", "by_key", "definition", "fanout", "headers", "kind", "topic")

    def __init__(self, definition: ExchangeDef) -> None:
        self.definition = definition
        self.kind = _routing_type(definition)
        self.bindings: dict[Any, BindingDef] = {}
        self.by_key: dict[str, dict[Destination, int]] = {}  # direct
        self.fanout: dict[Destination, int] = {}
        self.topic: TopicTrie[Destination] = TopicTrie()
        self.headers: dict[Any, tuple[HeadersMatcher, Destination]] = {}

    def add(self, binding: BindingDef) -> None:
        identity = binding.identity
        if identity in self.bindings:
            return
        self.bindings[identity] = binding
        destination: Destination = (binding.destination_type, binding.destination)
        if self.kind == "direct":
            _count_up(self.by_key.setdefault(binding.routing_key, {}), destination)
        elif self.kind == "fanout":
            _count_up(self.fanout, destination)
        elif self.kind == "topic":
            self.topic.add(binding.routing_key, destination)
        elif self.kind == "headers":
            matcher = HeadersMatcher(binding.arguments, binding.argument_wire)
            self.headers[identity] = (matcher, destination)

    def remove(self, binding: BindingDef) -> None:
        identity = binding.identity
        if self.bindings.pop(identity, None) is None:
            return
        destination: Destination = (binding.destination_type, binding.destination)
        if self.kind == "direct":
            counts = self.by_key.get(binding.routing_key, {})
            _count_down(counts, destination)
            if not counts:
                self.by_key.pop(binding.routing_key, None)
        elif self.kind == "fanout":
            _count_down(self.fanout, destination)
        elif self.kind == "topic":
            self.topic.remove(binding.routing_key, destination)
        elif self.kind == "headers":
            self.headers.pop(identity, None)

    def match(
        self,
        routing_keys: list[str],
        headers: Mapping[str, Any] | None,
        properties: Buffer | None = None,
    ) -> set[Destination]:
        if self.kind == "direct":
            if len(routing_keys) == 1:
                return set(self.by_key.get(routing_keys[0], ()))
            return {d for key in routing_keys for d in self.by_key.get(key, ())}
        if self.kind == "fanout":
            return set(self.fanout)
        if self.kind == "topic":
            found: set[Destination] = set()
            for key in routing_keys:
                found |= self.topic.match(key)
            return found
        if self.kind == "headers":
            if not self.headers:
                return set()
            terms = header_terms(headers, properties)
            return {dest for matcher, dest in self.headers.values() if matcher.matches(terms)}
        return set()  # an exchange type we cannot route (yet)


class Router:
    """Routing state of one vhost, kept in step with the metadata store."""

    def __init__(self, vhost: str) -> None:
        self.vhost = vhost
        self._exchanges: dict[str, _ExchangeRoutes] = {}
        self._queues: set[str] = set()
        # (exchange, routing key) -> its result, for publishes without headers or an
        # x-delay (the result then depends on nothing else); emptied by every change.
        self._cache: dict[tuple[str, str], RouteResult] = {}
        self.add_exchange(ExchangeDef(vhost=vhost, name=DEFAULT_EXCHANGE, type="direct"))

    @classmethod
    def from_definitions(
        cls,
        vhost: str,
        exchanges: Iterable[ExchangeDef],
        queues: Iterable[str],
        bindings: Iterable[BindingDef],
    ) -> Router:
        router = cls(vhost)
        for exchange in exchanges:
            router.add_exchange(exchange)
        for queue in queues:
            router.add_queue(queue)
        for binding in bindings:
            router.add_binding(binding)
        return router

    # --- incremental updates ---

    def add_exchange(self, definition: ExchangeDef) -> None:
        """Add, or replace the definition while keeping the exchange's bindings."""
        self._cache.clear()
        previous = self._exchanges.get(definition.name)
        routes = _ExchangeRoutes(definition)
        self._exchanges[definition.name] = routes
        if previous is not None:
            for binding in previous.bindings.values():
                routes.add(binding)

    def remove_exchange(self, name: str) -> None:
        """Drop the exchange, its bindings and the bindings leading to it."""
        self._cache.clear()
        if self._exchanges.pop(name, None) is not None:
            self._drop_bindings_to(("exchange", name))

    def add_queue(self, name: str) -> None:
        self._cache.clear()
        self._queues.add(name)

    def remove_queue(self, name: str) -> None:
        self._cache.clear()
        self._queues.discard(name)
        self._drop_bindings_to(("queue", name))

    def add_binding(self, binding: BindingDef) -> None:
        self._cache.clear()
        routes = self._exchanges.get(binding.source)
        if routes is None:
            raise UnknownExchange(binding.source)
        routes.add(binding)

    def remove_binding(self, binding: BindingDef) -> None:
        self._cache.clear()
        routes = self._exchanges.get(binding.source)
        if routes is not None:
            routes.remove(binding)

    def apply_deletions(self, deletions: Deletions) -> None:
        """Follow a store operation's cascade (bindings, auto-deleted exchanges, queues)."""
        for binding in deletions.bindings:
            if binding.vhost == self.vhost:
                self.remove_binding(binding)
        for exchange in deletions.exchanges:
            if exchange.vhost == self.vhost:
                self.remove_exchange(exchange.name)
        for queue in deletions.queues:
            if queue.vhost == self.vhost:
                self.remove_queue(queue.name)

    def _drop_bindings_to(self, destination: Destination) -> None:
        # O(bindings in the vhost); deletions are rare next to publishes.
        kind, name = destination
        for routes in self._exchanges.values():
            doomed = [
                b
                for b in routes.bindings.values()
                if b.destination_type == kind and b.destination == name
            ]
            for binding in doomed:
                routes.remove(binding)

    # --- lookups ---

    def get_exchange(self, name: str) -> ExchangeDef | None:
        routes = self._exchanges.get(name)
        return routes.definition if routes else None

    def is_internal(self, name: str) -> bool:
        """Internal exchanges take no direct publishes (the caller raises 403)."""
        routes = self._exchanges.get(name)
        return routes is not None and routes.definition.internal

    def has_queue(self, name: str) -> bool:
        return name in self._queues

    # --- routing ---

    def route(
        self,
        exchange: str,
        routing_key: str,
        headers: Mapping[str, Any] | None = None,
        properties: Buffer | None = None,
        hold_delayed: bool = False,
    ) -> RouteResult:
        """Queues a message published to ``exchange`` reaches (empty set: unroutable).

        ``properties``: the raw basic properties, for the wire types of headers (see
        field_terms.py). ``hold_delayed``: the message has an x-delay to wait for, so every
        x-delayed-message exchange reached, bound exchanges included, holds it (``held_by``)
        as the plugin's route/2 does, rather than routing it now."""
        cacheable = headers is None and not hold_delayed
        if cacheable:
            cached = self._cache.get((exchange, routing_key))
            if cached is not None:
                return cached
        result = self._route(exchange, routing_key, headers, properties, hold_delayed)
        if cacheable:
            if len(self._cache) >= ROUTE_CACHE_SIZE:  # keys without end (one per message)
                self._cache.clear()
            self._cache[(exchange, routing_key)] = result
        return result

    def _route(
        self,
        exchange: str,
        routing_key: str,
        headers: Mapping[str, Any] | None,
        properties: Buffer | None,
        hold_delayed: bool,
    ) -> RouteResult:
        start = self._exchanges.get(exchange)
        if start is None:
            raise UnknownExchange(exchange)
        routing_keys = [routing_key, *header_routing_keys(headers)]
        queues: set[str] = set()
        visited: list[str] = []
        held: list[str] = []
        seen = {exchange}
        work = [start]
        used_alternate = False
        while work:
            routes = work.pop()
            visited.append(routes.definition.name)
            if routes.definition.name == DEFAULT_EXCHANGE:
                queues.update(key for key in routing_keys if key in self._queues)
                continue
            if hold_delayed and routes.definition.type == DELAYED_MESSAGE_EXCHANGE_TYPE:
                held.append(routes.definition.name)
                continue  # not its alternate exchange either (see delayed_exchange.py)
            destinations = routes.match(routing_keys, headers, properties)
            if not destinations:
                alternate = routes.definition.alternate_exchange
                if alternate is None:
                    continue
                destinations = {("exchange", alternate)}
                used_alternate = True
            for kind, name in destinations:
                if kind == "queue":
                    queues.add(name)
                elif name not in seen:
                    seen.add(name)
                    target = self._exchanges.get(name)
                    if target is not None:  # a missing alternate exchange is ignored
                        work.append(target)
        return RouteResult(
            frozenset(queues), tuple(visited), used_alternate, tuple(held), tuple(sorted(queues))
        )
