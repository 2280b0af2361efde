"""Definitions in RabbitMQ 3.10's JSON format (the management plugin's ``/api/definitions``
and ``rabbitmqctl export_definitions``): the document's models and parsing, and the plan
of an import. Export is in meta/definitions_export.py; the checks that make an import
all-or-nothing are in meta/definitions_plan.py.

Parsing follows RabbitMQ's import: unknown fields are ignored; values must have their
JSON types (a wrong type is an error naming its place in the file, such as
``queues[3].durable: Input should be a valid boolean``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from meta.models import (
    BindingDef,
    ExchangeDef,
    Permission,
    Policy,
    QueueDef,
    User,
    VHost,
    VHostLimits,
)

MAX_REPORTED_ERRORS = 20
KINDS = ("vhosts", "users", "permissions", "policies", "exchanges", "queues", "bindings")
IGNORED_KINDS = ("topic_permissions", "parameters", "global_parameters")


class DefinitionsError(Exception):
    """The document was refused; ``errors`` are "<place in the file>: <why>" texts."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        shown = errors[:MAX_REPORTED_ERRORS]
        more = len(errors) - len(shown)
        super().__init__("; ".join(shown) + (f"; ... and {more} more" if more else ""))

    @property
    def reason(self) -> str:
        return str(self)


# --- the document as read ----------------------------------------------------------------


def split_tags(value: Any) -> list[str]:
    """RabbitMQ writes tags as a list; older files (and the HTTP API) as "a,b"."""
    if value is None:
        return []
    if isinstance(value, str):
        items: Iterable[Any] = value.split(",")
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        items = value
    else:
        raise ValueError("tags must be a string or a list of strings")
    return [t.strip() for t in items if t.strip()]


def _empty_arguments(value: Any) -> Any:
    # RabbitMQ's args/1 takes a missing value, null or [] for "no arguments".
    return {} if value is None or value == [] else value


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True, populate_by_name=True)


class UserIn(_In):
    name: str
    password_hash: str | None = None
    password: str | None = None
    hashing_algorithm: str | None = None
    tags: list[str] = Field(default_factory=list)
    _tags = field_validator("tags", mode="before")(split_tags)


class VHostMetadataIn(_In):
    description: str | None = None
    tags: list[str] | None = None
    _tags = field_validator("tags", mode="before")(split_tags)


class VHostIn(_In):
    name: str
    description: str | None = None
    tags: list[str] | None = None
    metadata: VHostMetadataIn | None = None
    _tags = field_validator("tags", mode="before")(split_tags)

    def definition(self) -> VHost:
        meta = self.metadata or VHostMetadataIn()
        description = self.description if self.description is not None else meta.description
        tags = self.tags if self.tags is not None else meta.tags
        return VHost(name=self.name, description=description or "", tags=tuple(tags or ()))


class PermissionIn(_In):
    user: str
    vhost: str
    configure: str
    write: str
    read: str


class PolicyIn(_In):
    vhost: str | None = None
    name: str
    pattern: str
    definition: dict[str, Any]
    priority: int = 0
    apply_to: Literal["queues", "exchanges", "all"] = Field("all", alias="apply-to")


class _WithArgumentsIn(_In):
    vhost: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    _arguments = field_validator("arguments", mode="before")(_empty_arguments)


class QueueIn(_WithArgumentsIn):
    name: str
    durable: bool = True
    auto_delete: bool = False


class ExchangeIn(_WithArgumentsIn):
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False


class BindingIn(_WithArgumentsIn):
    source: str
    destination: str
    destination_type: Literal["queue", "exchange"]
    routing_key: str = ""


class DefinitionsIn(_In):
    rabbit_version: str | None = None
    rabbitmq_version: str | None = None
    users: list[UserIn] = Field(default_factory=list)
    vhosts: list[VHostIn] = Field(default_factory=list)
    permissions: list[PermissionIn] = Field(default_factory=list)
    topic_permissions: list[dict[str, Any]] = Field(default_factory=list)
    parameters: list[dict[str, Any]] = Field(default_factory=list)
    global_parameters: list[dict[str, Any]] = Field(default_factory=list)
    policies: list[PolicyIn] = Field(default_factory=list)
    queues: list[QueueIn] = Field(default_factory=list)
    exchanges: list[ExchangeIn] = Field(default_factory=list)
    bindings: list[BindingIn] = Field(default_factory=list)

    @property
    def version(self) -> str | None:
        return self.rabbitmq_version or self.rabbit_version

    def entity_count(self) -> int:
        return sum(
            len(items)
            for items in (
                self.users,
                self.vhosts,
                self.permissions,
                self.topic_permissions,
                self.parameters,
                self.global_parameters,
                self.policies,
                self.queues,
                self.exchanges,
                self.bindings,
            )
        )


def error_path(loc: Iterable[int | str]) -> str:
    """('queues', 3, 'durable') -> 'queues[3].durable'."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path


def describe_validation_error(error: ValidationError) -> list[str]:
    texts = []
    for item in error.errors(include_url=False):
        where = error_path(item["loc"])
        texts.append(f"{where}: {item['msg']}" if where else item["msg"])
    return texts


def parse_definitions(body: bytes | str) -> DefinitionsIn:
    """Parse a whole document; an empty body is an empty document (as in RabbitMQ)."""
    if not body.strip():
        return DefinitionsIn()
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise DefinitionsError([f"failed_to_parse_json: {error}"]) from None
    if not isinstance(data, dict):
        raise DefinitionsError(["failed_to_parse_json: the document must be a JSON object"])
    try:
        return DefinitionsIn.model_validate(data)
    except ValidationError as error:
        raise DefinitionsError(describe_validation_error(error)) from None


# --- what an import does ------------------------------------------------------------------


@dataclass
class ImportPlan:
    """What an import will create or replace, and counts per kind: "created", "updated"
    (users, permissions, policies replaced), "present" (already so), "skipped"."""

    vhosts: list[VHost] = field(default_factory=list)
    users: list[User] = field(default_factory=list)
    permissions: list[Permission] = field(default_factory=list)
    policies: list[Policy] = field(default_factory=list)
    exchanges: list[ExchangeDef] = field(default_factory=list)
    queues: list[QueueDef] = field(default_factory=list)
    bindings: list[BindingDef] = field(default_factory=list)
    # "parameters" of component "vhost-limits" (meta.vhost_limits): replaced whole.
    vhost_limits: list[VHostLimits] = field(default_factory=list)
    limits_counts: Counter[str] = field(default_factory=Counter)
    counts: dict[str, Counter[str]] = field(default_factory=lambda: {k: Counter() for k in KINDS})
    ignored: Counter[str] = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)

    @property
    def changes(self) -> int:
        return sum(len(getattr(self, kind)) for kind in KINDS) + len(self.vhost_limits)

    def summary(self) -> dict[str, Any]:
        counts: dict[str, Any] = {
            kind: {"created": c["created"], "updated": c["updated"], "present": c["present"]}
            | ({"skipped": c["skipped"]} if c["skipped"] else {})
            for kind, c in self.counts.items()
        }
        if self.limits_counts:
            c = self.limits_counts
            counts["vhost_limits"] = {k: c[k] for k in ("created", "updated", "present")}
        return {**counts, "ignored": dict(self.ignored), "warnings": self.warnings}


def summary_text(summary: dict[str, Any]) -> str:
    """One line: "vhosts 1 created, 0 present; users ...; ignored: parameters 2"."""
    parts = []
    for kind in (*KINDS, "vhost_limits"):
        counts = summary.get(kind) or {}
        if kind == "vhost_limits" and not counts:
            continue
        text = f"{kind} {counts.get('created', 0)} created, {counts.get('present', 0)} present"
        for extra in ("updated", "skipped"):
            if counts.get(extra):
                text += f", {counts[extra]} {extra}"
        parts.append(text)
    ignored = summary.get("ignored") or {}
    if ignored:
        parts.append("ignored: " + ", ".join(f"{k} {v}" for k, v in ignored.items()))
    return "; ".join(parts)
