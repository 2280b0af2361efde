"""Definitions export in RabbitMQ 3.10's JSON format, as its management plugin writes it
(``GET /api/definitions``): the same top-level fields and entity fields in the same order.

What is exported: users, vhosts, permissions, policies, durable exchanges (not the default
exchange nor the predeclared amq.* ones), durable non-exclusive queues, and the bindings
between exported (or predeclared) ends, and the vhost limits (the "vhost-limits" entries of
"parameters"); RabbitMQ's topic permissions, other runtime parameters and global parameters
have no mqgw counterpart and are written as empty lists.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Mapping
from decimal import Decimal
from importlib import metadata
from typing import Any

from meta.amqp_values import timestamp_seconds
from meta.models import BindingDef, ExchangeDef, Permission, Policy, QueueDef, User, VHost
from meta.store import MetadataStore
from meta.vhost_limits import parameter_entry

# The RabbitMQ release whose format (and behaviour) mqgw follows; RabbitMQ reads
# rabbit_version only to pick a hashing algorithm for users that do not name one.
RABBIT_VERSION = "3.10.8"
PRODUCT_NAME = "mqgw"


def json_value(value: Any) -> Any:
    """An AMQP argument value as RabbitMQ's JSON shows it (binaries as text where possible)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(raw).decode("ascii")
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, dt.datetime):
        return timestamp_seconds(value)
    if isinstance(value, Mapping):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    return str(value)


def product_version() -> str:
    try:
        return metadata.version("mqgw")
    except metadata.PackageNotFoundError:
        return "unknown"


def user_entry(user: User) -> dict[str, Any]:
    return {
        "name": user.name,
        "password_hash": user.password_hash,
        "hashing_algorithm": user.hashing_algorithm,
        "tags": list(user.tags),
        "limits": {},
    }


def vhost_entry(vhost: VHost) -> dict[str, Any]:
    # The management plugin of 3.10 writes {"name"} only; rabbitmqctl adds limits and
    # metadata, which RabbitMQ's import reads (so descriptions and tags survive).
    return {
        "name": vhost.name,
        "limits": {},
        "metadata": {"description": vhost.description, "tags": list(vhost.tags)},
    }


def permission_entry(permission: Permission) -> dict[str, Any]:
    return {
        "user": permission.user,
        "vhost": permission.vhost,
        "configure": permission.configure,
        "write": permission.write,
        "read": permission.read,
    }


def policy_entry(policy: Policy) -> dict[str, Any]:
    return {
        "vhost": policy.vhost,
        "name": policy.name,
        "pattern": policy.pattern,
        "apply-to": policy.apply_to,
        "definition": json_value(policy.definition),
        "priority": policy.priority,
    }


def queue_entry(queue: QueueDef, with_vhost: bool = True) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": queue.name, "vhost": queue.vhost}
    entry |= {"durable": queue.durable, "auto_delete": queue.auto_delete}
    entry["arguments"] = json_value(queue.arguments)
    return entry if with_vhost else _without_vhost(entry)


def exchange_entry(exchange: ExchangeDef, with_vhost: bool = True) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": exchange.name,
        "vhost": exchange.vhost,
        "type": exchange.type,
        "durable": exchange.durable,
        "auto_delete": exchange.auto_delete,
        "internal": exchange.internal,
        "arguments": json_value(exchange.arguments),
    }
    return entry if with_vhost else _without_vhost(entry)


def binding_entry(binding: BindingDef, with_vhost: bool = True) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "source": binding.source,
        "vhost": binding.vhost,
        "destination": binding.destination,
        "destination_type": binding.destination_type,
        "routing_key": binding.routing_key,
        "arguments": json_value(binding.arguments),
    }
    return entry if with_vhost else _without_vhost(entry)


def _without_vhost(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "vhost"}


def exported_exchange(exchange: ExchangeDef) -> bool:
    """Durable ones, but not the default exchange nor amq.* (predeclared, never imported)."""
    return exchange.durable and exchange.name != "" and not exchange.name.startswith("amq.")


def exported_queue(queue: QueueDef) -> bool:
    return queue.durable and not queue.exclusive


def exported_binding(
    binding: BindingDef, exchanges: Mapping[str, ExchangeDef], queues: Mapping[str, QueueDef]
) -> bool:
    """RabbitMQ's export_binding/2 (no default-exchange bindings; queue destinations only
    if exported), with both ends durable: an import must find every end it names."""
    source = exchanges.get(binding.source)
    if binding.source == "" or source is None or not source.durable:
        return False
    if binding.destination_type == "queue":
        queue = queues.get(binding.destination)
        return queue is not None and exported_queue(queue)
    destination = exchanges.get(binding.destination)
    return binding.destination != "" and destination is not None and destination.durable


async def _topology(
    store: MetadataStore, vhost: str
) -> tuple[list[ExchangeDef], list[QueueDef], list[BindingDef]]:
    exchanges = {x.name: x for x in await store.list_exchanges(vhost)}
    queues = {q.name: q for q in await store.list_queues(vhost)}
    bindings = [
        b for b in await store.list_bindings(vhost) if exported_binding(b, exchanges, queues)
    ]
    # RabbitMQ lists them in its route table's order: by source, then routing key.
    bindings.sort(key=lambda b: (b.source, b.routing_key, b.destination_type, b.destination))
    return (
        [x for x in exchanges.values() if exported_exchange(x)],
        [q for q in queues.values() if exported_queue(q)],
        bindings,
    )


async def export_definitions(store: MetadataStore, vhost: str | None = None) -> dict[str, Any]:
    """The node's definitions; with ``vhost``, RabbitMQ's per-vhost document (no users,
    vhosts or permissions; queues, exchanges and bindings without their "vhost" key)."""
    names = [vhost] if vhost is not None else [v.name for v in await store.list_vhosts()]
    exchanges: list[dict[str, Any]] = []
    queues: list[dict[str, Any]] = []
    bindings: list[dict[str, Any]] = []
    with_vhost = vhost is None
    for name in names:
        xs, qs, bs = await _topology(store, name)
        exchanges += [exchange_entry(x, with_vhost) for x in xs]
        queues += [queue_entry(q, with_vhost) for q in qs]
        bindings += [binding_entry(b, with_vhost) for b in bs]
    policies = [policy_entry(p) for p in await store.list_policies(vhost)]
    limits = [v for v in await store.list_vhost_limits() if vhost is None or v.vhost == vhost]
    parameters = [parameter_entry(v) for v in limits]
    if vhost is not None:
        return {
            "rabbit_version": RABBIT_VERSION,
            "parameters": parameters,
            "policies": policies,
            "queues": queues,
            "exchanges": exchanges,
            "bindings": bindings,
        }
    return {
        "rabbit_version": RABBIT_VERSION,
        "rabbitmq_version": RABBIT_VERSION,
        "product_name": PRODUCT_NAME,
        "product_version": product_version(),
        "users": [user_entry(u) for u in await store.list_users()],
        "vhosts": [vhost_entry(v) for v in await store.list_vhosts()],
        "permissions": [permission_entry(p) for p in await store.list_permissions()],
        "topic_permissions": [],
        "parameters": parameters,
        "global_parameters": [],
        "policies": policies,
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    }
