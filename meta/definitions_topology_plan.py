"""Definitions import: the checks of exchanges, queues and bindings against the node.

The rules exchange.declare, queue.declare and queue.bind apply (meta.checks,
meta.queue_arguments) run on each entry, against what the file declared before it and what
the node holds: an equivalent entity is counted present, a new one planned, a different one
refused. A new queue gets its partition count as queue.declare would give it, the file's
policies included. The default exchange and ``amq.*`` names are skipped, and a binding whose
end is missing is skipped with a warning, as RabbitMQ's import does.
"""

from __future__ import annotations

from meta import checks
from meta.definitions import BindingIn, ExchangeIn, QueueIn
from meta.definitions_checks import Refused, check_name
from meta.definitions_planner import PlannerBase
from meta.errors import AccessRefused, exchange_not_found, queue_not_found, resource_name
from meta.models import (
    DELAYED_MESSAGE_EXCHANGE_TYPE,
    PREDECLARED_EXCHANGES,
    BindingDef,
    ExchangeDef,
    QueueDef,
)
from meta.partitions import initial_partitions, policy_in_force
from meta.queue_arguments import check_queue_arguments
from meta.state import augment_queue_arguments

_PREDECLARED = {name: (type_, internal) for name, type_, internal in PREDECLARED_EXCHANGES}


class TopologyPlanning(PlannerBase):
    """The planner's exchanges, queues and bindings."""

    async def find_exchange(self, vhost: str, name: str) -> ExchangeDef | None:
        known = self.exchanges.get((vhost, name))
        if known is not None:
            return known
        if vhost in self.node_vhosts:
            return await self.store.get_exchange(vhost, name)
        if name in _PREDECLARED:  # a vhost this file creates gets them too
            type_, internal = _PREDECLARED[name]
            return ExchangeDef(vhost=vhost, name=name, type=type_, internal=internal)
        return None

    async def find_queue(self, vhost: str, name: str) -> QueueDef | None:
        known = self.queues.get((vhost, name))
        if known is not None or vhost not in self.node_vhosts:
            return known
        return await self.store.get_queue(vhost, name)

    def reserved(self, kind: str, name: str) -> bool:
        """RabbitMQ skips (with a warning) the default exchange and amq.* names."""
        if name.startswith("amq.") or (kind == "exchanges" and name == ""):
            self.count(kind, "skipped")
            self.plan.warnings.append(f"{self.path}: '{name}' is a reserved name: not imported")
            return True
        return False

    async def exchange(self, entry: ExchangeIn) -> None:
        vhost = self.vhost_of(entry.vhost)
        if self.reserved("exchanges", entry.name):
            return
        new = ExchangeDef(
            vhost=vhost,
            name=entry.name,
            type=entry.type,
            durable=entry.durable,
            auto_delete=entry.auto_delete,
            internal=entry.internal,
            arguments=entry.arguments,
        )
        if entry.type not in self.exchange_types:
            raise Refused(".type", f"unknown exchange type '{entry.type}'")
        current = await self.find_exchange(vhost, entry.name)
        if current is not None:
            checks.assert_exchange_equivalent(current, new)
            self.count("exchanges", "present")
            return
        resource = resource_name("exchange", entry.name, vhost)
        checks.check_exchange_name_arg(new.arguments, {}, "alternate-exchange", resource)
        if new.type == DELAYED_MESSAGE_EXCHANGE_TYPE:
            checks.check_delayed_exchange(new)
        self.exchanges[(vhost, new.name)] = new
        self.plan.exchanges.append(new)
        self.count("exchanges", "created")

    async def queue(self, entry: QueueIn) -> None:
        vhost = self.vhost_of(entry.vhost)
        if self.reserved("queues", entry.name):
            return
        check_name("queue", entry.name)
        new = augment_queue_arguments(
            QueueDef(
                vhost=vhost,
                name=entry.name,
                durable=entry.durable,
                auto_delete=entry.auto_delete,
                arguments=entry.arguments,
            )
        )
        current = await self.find_queue(vhost, entry.name)
        if current is not None:
            checks.assert_queue_equivalent(current, new)
            self.count("queues", "present")
            return
        policy = policy_in_force(await self.policies_in_force(vhost), new.name)
        policy_definition = None if policy is None else policy.definition
        partitions = initial_partitions(new, policy_definition, self.default_partitions)
        new = new.model_copy(update={"partitions": partitions})  # as queue.declare does
        resource = resource_name("queue", entry.name, vhost)
        checks.check_exchange_name_arg(new.arguments, {}, "x-dead-letter-exchange", resource)
        check_queue_arguments(new)
        self.queues[(vhost, new.name)] = new
        self.plan.queues.append(new)
        self.count("queues", "created")

    async def binding(self, entry: BindingIn) -> None:
        vhost = self.vhost_of(entry.vhost)
        binding = BindingDef(
            vhost=vhost,
            source=entry.source,
            destination=entry.destination,
            destination_type=entry.destination_type,
            routing_key=entry.routing_key,
            arguments=entry.arguments,
        )
        if entry.source == "" or (entry.destination_type == "exchange" and not entry.destination):
            raise AccessRefused("operation not permitted on the default exchange")
        source = await self.find_exchange(vhost, entry.source)
        if entry.destination_type == "queue":
            destination: ExchangeDef | QueueDef | None = await self.find_queue(
                vhost, entry.destination
            )
            missing = queue_not_found(vhost, entry.destination)
        else:
            destination = await self.find_exchange(vhost, entry.destination)
            missing = exchange_not_found(vhost, entry.destination)
        if source is None or destination is None:
            # rabbitmqctl export_definitions lists the bindings of exclusive queues and
            # internal exchanges, which it does not export; RabbitMQ's import ignores them.
            what = exchange_not_found(vhost, entry.source) if source is None else missing
            self.plan.warnings.append(f"{self.path}: {what.detail}: binding skipped")
            self.count("bindings", "skipped")
            return
        if isinstance(destination, QueueDef):
            checks.check_exclusive_access(destination, None)
        checks.validate_binding(
            source, binding, max_topic_hash_wildcards=self.max_topic_hash_wildcards
        )
        key = (vhost, binding.identity)
        if key in self.bindings or await self.bound(binding):
            self.count("bindings", "present")
            return
        self.bindings.add(key)
        self.plan.bindings.append(binding)
        self.count("bindings", "created")

    async def bound(self, binding: BindingDef) -> bool:
        if binding.vhost not in self.node_vhosts:
            return False
        source = (binding.vhost, binding.source)
        existing = self.bound_by_source.get(source)
        if existing is None:  # once per source: 10,000 bindings of one exchange stay cheap
            found = await self.store.bindings_for(*source)
            existing = self.bound_by_source[source] = {b.identity for b in found}
        return binding.identity in existing
