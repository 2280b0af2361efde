"""Pydantic models of the metadata, shaped like RabbitMQ's definitions JSON.

``arguments`` hold plain decoded AMQP values; ``argument_types`` optionally records
the wire type of each top-level argument (as the client sent it) so that error texts
can name it as RabbitMQ does. Missing entries are inferred (see amqp_values.infer_type).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from meta.amqp_values import erlang_term, infer_type
from meta.password import check_password

# Built-in exchange types; plugins (x-delayed-message, ...) register more in the store.
BUILTIN_EXCHANGE_TYPES: frozenset[str] = frozenset({"direct", "fanout", "topic", "headers"})
DELAYED_MESSAGE_EXCHANGE_TYPE = "x-delayed-message"

DEFAULT_VHOST = "/"
DEFAULT_EXCHANGE = ""

# rabbit_vhost:declare_default_exchanges/2: (name, type, internal); all durable.
PREDECLARED_EXCHANGES: tuple[tuple[str, str, bool], ...] = (
    ("", "direct", False),
    ("amq.direct", "direct", False),
    ("amq.topic", "topic", False),
    ("amq.match", "headers", False),
    ("amq.headers", "headers", False),
    ("amq.fanout", "fanout", False),
    ("amq.rabbitmq.trace", "topic", True),
)

DestinationType = Literal["queue", "exchange"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class VHost(_Model):
    name: str
    description: str = ""
    tags: tuple[str, ...] = ()
    # The firehose (gateway/observe/firehose.py): publishes and deliveries copied to
    # amq.rabbitmq.trace.
    tracing: bool = False
    # Broker groups its queues are pinned to unless they say otherwise (meta/group_pins.py).
    default_groups: tuple[str, ...] = ()


class VHostLimits(_Model):
    """RabbitMQ's per-vhost limits ("vhost-limits" parameter): name -> value, e.g.
    {"max-connections": 10, "max-queues": 5}; a negative value is no limit (meta.vhost_limits
    checks names and values). Kept when its last limit is cleared, as RabbitMQ keeps it."""

    vhost: str
    limits: dict[str, int] = Field(default_factory=dict)


class User(_Model):
    name: str
    password_hash: str
    hashing_algorithm: str = "rabbit_password_hashing_sha256"
    tags: tuple[str, ...] = ()

    @property
    def is_administrator(self) -> bool:
        return "administrator" in self.tags

    def accepts(self, password: str) -> bool:
        """``password`` is this user's (checked against the hash, in constant time)."""
        return check_password(password, self.password_hash, self.hashing_algorithm)


class Permission(_Model):
    """Regexes matched against resource names, as in RabbitMQ (``^$`` = nothing)."""

    user: str
    vhost: str
    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"


class Policy(_Model):
    """A RabbitMQ policy: ``definition`` applies to the matching queues (and/or exchanges).

    The highest ``priority`` among the policies whose ``pattern`` (a regex searched in the
    name) matches is the one in force; keys are RabbitMQ's ("message-ttl", "max-length",
    "dead-letter-exchange", "max-age", ...) plus mqgw's ("redelivery", "max-redeliveries",
    "disk-overflow").
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    vhost: str
    name: str
    pattern: str
    definition: dict[str, Any]
    priority: int = 0
    apply_to: Literal["queues", "exchanges", "all"] = Field("all", alias="apply-to")

    def applies_to_queue(self, name: str) -> bool:
        return self.apply_to in ("queues", "all") and re.search(self.pattern, name) is not None


ControlScope = Literal["global", "node", "vhost", "client", "connection", "queue"]
# Widest first: for stop/start the narrowest control that applies wins.
CONTROL_SCOPES: tuple[ControlScope, ...] = (
    "global",
    "node",
    "vhost",
    "client",
    "connection",
    "queue",
)
ControlState = Literal["stopped", "running"]


class ConsumptionControl(_Model):
    """An operator's stop/start and rate limit for a scope of consumers.

    ``name`` is the node name, the client's connection_name or source address, the
    connection's management name, or the queue's name ("" for global and vhost); ``vhost``
    is set for the vhost and queue scopes only. ``state`` None leaves stop/start to wider
    scopes; a rate of None is no limit. ``publish_rate_*`` slow the publishers in scope
    (back-pressure, nothing refused). A rate at the global, vhost, client and queue scopes
    is the total over every gateway.
    """

    scope: ControlScope
    name: str = ""
    vhost: str = ""
    state: ControlState | None = None
    rate_msgs: float | None = Field(None, gt=0)
    rate_bytes: float | None = Field(None, gt=0)
    publish_rate_msgs: float | None = Field(None, gt=0)
    publish_rate_bytes: float | None = Field(None, gt=0)
    set_by: str = ""
    set_at: str = ""  # ISO 8601, UTC

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.scope, self.vhost, self.name)

    @property
    def is_empty(self) -> bool:
        rates = (self.rate_msgs, self.rate_bytes, self.publish_rate_msgs, self.publish_rate_bytes)
        return self.state is None and all(rate is None for rate in rates)


class GrayMatch(_Model):
    """Which connections a gray rule applies to; every key given must match (none: all)."""

    connection_name: str | None = None  # a glob on the client's connection_name
    user: str | None = None
    address: str | None = None  # the client's address, or a CIDR block


class GrayRule(_Model):
    """An operator's gray release rule (gateway/features/gray.py): the matching connections
    are gray (or not), whatever their client property says. ``switch`` False turns gray
    handling off for them (they consume every partition); ``drain`` with ``gray`` False moves
    their consumers back to normal partitions only once the gray ones they read are drained.
    """

    name: str
    match: GrayMatch = Field(default_factory=GrayMatch)
    gray: bool = True
    switch: bool | None = None
    drain: bool = False
    set_at: str = ""  # ISO 8601, UTC: when the rule was last set (a drain counts from it)


class GrayEnd(_Model):
    """Gray release ended for a queue (``mqgw ctl gray end``): it has no gray partitions from
    then on, whatever its argument or policy say, and every consumer reads every partition;
    ``ends`` are the gray partitions and their end offsets at the end: drained once every
    message below is settled."""

    vhost: str
    queue: str
    ends: dict[int, int] = Field(default_factory=dict)  # gray partition -> end offset
    set_at: str = ""  # ISO 8601, UTC


class _WithArguments(_Model):
    arguments: dict[str, Any] = Field(default_factory=dict)
    argument_types: dict[str, str] = Field(default_factory=dict)

    def argument_type(self, key: str) -> str:
        """The AMQP type of argument ``key`` as sent, or as RabbitMQ would infer it."""
        known = self.argument_types.get(key)
        return known if known is not None else infer_type(self.arguments[key])


class ExchangeDef(_WithArguments):
    vhost: str
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False

    @property
    def alternate_exchange(self) -> str | None:
        value = self.arguments.get("alternate-exchange")
        return value if isinstance(value, str) else None


class QueueDef(_WithArguments):
    vhost: str
    name: str
    durable: bool = True
    exclusive_owner: str | None = None  # connection id of the exclusive owner
    auto_delete: bool = False
    queue_id: int = 0  # assigned by the store; never reused
    partitions: int = 1

    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None


class BindingDef(_WithArguments):
    vhost: str
    source: str
    destination: str
    destination_type: DestinationType
    routing_key: str = ""
    # Table, array, timestamp and decimal arguments as the client sent them (base64 of type
    # code + value): a headers exchange compares nested values with their wire types, which
    # decoding loses (gateway/routing/field_terms.py). Empty for bindings made without AMQP.
    argument_wire: dict[str, str] = Field(default_factory=dict)

    @property
    def identity(self) -> tuple[str, str, str, str, Any]:
        """What makes two bindings the same (RabbitMQ: source, destination, key, args)."""
        return (
            self.source,
            self.destination_type,
            self.destination,
            self.routing_key,
            erlang_term(self.arguments),
        )


class Deletions(_Model):
    """Everything one store operation removed, cascades included, for cache updates."""

    exchanges: tuple[ExchangeDef, ...] = ()
    queues: tuple[QueueDef, ...] = ()
    bindings: tuple[BindingDef, ...] = ()
    touches_durable: bool = False  # whether persisted state changed

    def __bool__(self) -> bool:
        return bool(self.exchanges or self.queues or self.bindings)
