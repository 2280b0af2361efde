"""RabbitMQ 3.10's per-vhost limits: their names, how values are checked, their texts and
their JSON shapes (management API, definitions), and the embedded node's connection counts.

A vhost's limits are one ``VHostLimits`` record (meta.models), stored by the metadata store
beside the vhost (``set_vhost_limits``) and announced on the change feed as
``vhost_limits.set`` / ``vhost_limits.cleared``. Enforcement:

- ``max-connections``: every connection opening a vhost is counted by the store
  (``open_connection``; in a cluster a Redis set of "<gateway>/<n>" ids per vhost, so the
  count is over all gateways); one over the limit is refused at connection.open with 530.
- ``max-queues``: a queue.declare that creates a queue counts the vhost's queues inside the
  store's declare (the Redis transaction watches the queue index), 406 over the limit.

A negative value is no limit (RabbitMQ's -1); 0 refuses every new connection or queue.
Lowering a limit below the current count keeps what exists, as RabbitMQ does.
"""

from __future__ import annotations

import json
from typing import Any

from meta.errors import NotAllowed, PreconditionFailed
from meta.models import VHostLimits

MAX_CONNECTIONS = "max-connections"
MAX_QUEUES = "max-queues"
LIMIT_NAMES: tuple[str, ...] = (MAX_CONNECTIONS, MAX_QUEUES)
# The definitions "parameters" entry that carries them (component, name), as RabbitMQ has it.
PARAMETER_COMPONENT = "vhost-limits"
PARAMETER_NAME = "limits"


class LimitsInvalid(ValueError):
    """RabbitMQ's validation text (the management API's 400 "Validation failed" reason)."""


def check_limits(values: Any) -> dict[str, int]:
    """A limits object as given (JSON), checked as rabbit_vhost_limit validates it."""
    if values == []:  # RabbitMQ writes an empty limits object as []
        return {}
    if not isinstance(values, dict):
        raise LimitsInvalid(f"limits should be a JSON object, actually was {_erlang(values)}")
    unknown = [(k, v) for k, v in values.items() if k not in LIMIT_NAMES]
    if unknown:
        terms = ",".join(f'{{<<"{k}">>,{_erlang(v)}}}' for k, v in unknown)
        raise LimitsInvalid(f"Unrecognised terms [{terms}] in limits")
    checked = {}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise LimitsInvalid(f"{name} should be a number, actually was {_erlang(value)}")
        checked[name] = value
    return checked


def _erlang(value: Any) -> str:
    """A JSON value as RabbitMQ's validation texts print it (``<<"x">>`` for a string)."""
    if isinstance(value, str):
        return f'<<"{value}">>'
    return json.dumps(value)


def limit_of(limits: VHostLimits | None, name: str) -> int | None:
    """The limit in force (None: none; a negative value means none)."""
    if limits is None:
        return None
    value = limits.limits.get(name)
    return None if value is None or value < 0 else value


def limits_value(limits: VHostLimits) -> dict[str, int] | list[Any]:
    """The "value" of the JSON shapes: the object, or [] once empty (RabbitMQ's output)."""
    return dict(limits.limits) if limits.limits else []


def api_entry(limits: VHostLimits) -> dict[str, Any]:
    """One item of GET /api/vhost-limits: {"vhost": "/", "value": {"max-queues": 5}}."""
    return {"vhost": limits.vhost, "value": limits_value(limits)}


def parameter_entry(limits: VHostLimits) -> dict[str, Any]:
    """The definitions "parameters" entry, in RabbitMQ's key order."""
    return {
        "value": limits_value(limits),
        "vhost": limits.vhost,
        "component": PARAMETER_COMPONENT,
        "name": PARAMETER_NAME,
    }


def is_limits_parameter(entry: dict[str, Any]) -> bool:
    return entry.get("component") == PARAMETER_COMPONENT


def queue_limit_reached(vhost: str, name: str, limit: int) -> PreconditionFailed:
    """rabbit_queue_type: a queue.declare that would pass max-queues."""
    text = f"cannot declare queue '{name}': queue limit in vhost '{vhost}' ({limit}) is reached"
    return PreconditionFailed(text)


def connection_limit_reached(vhost: str, user: str, limit: int) -> NotAllowed:
    """rabbit_reader: connection.open of a vhost at max-connections."""
    reason = f"connection limit ({limit}) is reached"
    return NotAllowed(f"access to vhost '{vhost}' refused for user '{user}': {reason}")


class ConnectionCounts:
    """The embedded node's open connections per vhost (the Redis store keeps them in Redis)."""

    def __init__(self) -> None:
        self._by_vhost: dict[str, set[str]] = {}

    def open(self, vhost: str, connection_id: str, limit: int | None) -> bool:
        """Count the connection unless ``limit`` is reached; False if refused."""
        ids = self._by_vhost.setdefault(vhost, set())
        if limit is not None and connection_id not in ids and len(ids) >= limit:
            return False
        ids.add(connection_id)
        return True

    def close(self, vhost: str, connection_id: str) -> None:
        self._by_vhost.get(vhost, set()).discard(connection_id)

    def count(self, vhost: str) -> int:
        return len(self._by_vhost.get(vhost, ()))

    def forget_gateway(self, gateway_id: str) -> None:
        prefix = gateway_id + "/"
        for ids in self._by_vhost.values():
            ids.difference_update([i for i in ids if i.startswith(prefix)])

    def forget_vhost(self, vhost: str) -> None:
        self._by_vhost.pop(vhost, None)


class LocalConnections:
    """The connection-counting calls of the MetadataStore, for the local store."""

    _connections: ConnectionCounts

    async def open_connection(
        self, vhost: str, connection_id: str, max_connections: int | None
    ) -> bool:
        return self._connections.open(vhost, connection_id, max_connections)

    async def close_connection(self, vhost: str, connection_id: str) -> None:
        self._connections.close(vhost, connection_id)

    async def count_connections(self, vhost: str) -> int:
        return self._connections.count(vhost)

    async def forget_connections(self, gateway_id: str) -> None:
        self._connections.forget_gateway(gateway_id)
