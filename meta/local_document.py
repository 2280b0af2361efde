"""The embedded store's ``metadata.json``: what it holds and how it is written and read.

``LocalRecords`` is what the local store keeps beside the topology (meta.state) and the
routes (meta.local_routes): users, permissions, policies, controls, vhost limits and gray
release rules and ends. ``dump_document`` turns the durable part of all three into the file's
bytes (transient exchanges, queues and bindings stay out, as do the predeclared exchanges
every vhost gets anyway); ``load_document`` reads them back at start. Keys added after the
first format are optional on reading, so older files still load. Writing the bytes to disk
is meta.metadata_file's job; when to write is meta.local_base's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from meta.local_routes import LocalRoutes
from meta.models import (
    PREDECLARED_EXCHANGES,
    BindingDef,
    ConsumptionControl,
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
from meta.serialization import dump as _dump
from meta.serialization import load as _load
from meta.state import MetadataState

FILE_NAME = "metadata.json"
FORMAT_VERSION = 1
_PREDECLARED_NAMES = frozenset(name for name, _, _ in PREDECLARED_EXCHANGES)


@dataclass
class LocalRecords:
    """The local store's entities that are not topology, keyed as they are looked up."""

    users: dict[str, User] = field(default_factory=dict)
    permissions: dict[tuple[str, str], Permission] = field(default_factory=dict)
    policies: dict[tuple[str, str], Policy] = field(default_factory=dict)
    controls: dict[tuple[str, str, str], ConsumptionControl] = field(default_factory=dict)
    vhost_limits: dict[str, VHostLimits] = field(default_factory=dict)
    gray_rules: dict[str, GrayRule] = field(default_factory=dict)
    gray_ends: dict[tuple[str, str], GrayEnd] = field(default_factory=dict)  # (vhost, queue)


def dump_document(
    state: MetadataState, records: LocalRecords, routes: LocalRoutes, queue_id_floor: int
) -> bytes:
    """The file's bytes: every durable entity, and the queue-id floor to restart from."""
    exchanges, queues, bindings = [], [], []
    for vhost_state in state.vhosts.values():
        exchanges += [
            _dump(x)
            for x in vhost_state.exchanges.values()
            if x.durable and x.name not in _PREDECLARED_NAMES
        ]
        queues += [_dump(q) for q in vhost_state.queues.values() if q.durable]
        bindings += [
            _dump(b)
            for group in vhost_state.by_source.values()
            for b in group.values()
            if vhost_state.is_durable_binding(b)
        ]
    document = {
        "format": FORMAT_VERSION,
        "queue_id_floor": queue_id_floor,
        "vhosts": [_dump(s.vhost) for s in state.vhosts.values()],
        "users": [_dump(u) for u in records.users.values()],
        "permissions": [_dump(p) for p in records.permissions.values()],
        "policies": [_dump(p) for p in records.policies.values()],
        "controls": [_dump(c) for c in records.controls.values()],
        "vhost_limits": [_dump(v) for v in records.vhost_limits.values()],
        "gray_rules": [_dump(r) for r in records.gray_rules.values()],
        "gray_ends": [_dump(e) for e in records.gray_ends.values()],
        "routes": routes.dump(),
        "exchanges": exchanges,
        "queues": queues,
        "bindings": bindings,
    }
    return json.dumps(document, indent=1, sort_keys=True).encode("utf-8")


def load_document(
    path: Path, state: MetadataState, records: LocalRecords, routes: LocalRoutes
) -> int:
    """Fill ``state``, ``records`` and ``routes`` from the file; returns its queue-id floor."""
    document = json.loads(path.read_bytes())
    if document.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path}: unsupported format {document.get('format')!r}")
    floor = int(document["queue_id_floor"])
    for data in document["vhosts"]:
        state.add_vhost(_load(VHost, data))
    for data in document["users"]:
        user = _load(User, data)
        records.users[user.name] = user
    for data in document.get("policies", []):
        policy = _load(Policy, data)
        records.policies[(policy.vhost, policy.name)] = policy
    for data in document.get("controls", []):
        control = _load(ConsumptionControl, data)
        records.controls[control.key] = control
    for data in document.get("vhost_limits", []):
        limits = _load(VHostLimits, data)
        records.vhost_limits[limits.vhost] = limits
    for data in document.get("gray_rules", []):  # absent from files before gray rules
        rule = _load(GrayRule, data)
        records.gray_rules[rule.name] = rule
    for data in document["permissions"]:
        permission = _load(Permission, data)
        records.permissions[(permission.user, permission.vhost)] = permission
    state.restore(
        [_load(ExchangeDef, d) for d in document["exchanges"]],
        [_load(QueueDef, d) for d in document["queues"]],
        [_load(BindingDef, d) for d in document["bindings"]],
    )
    for data in document.get("gray_ends", []):  # absent from files before gray ends
        end = _load(GrayEnd, data)
        held = state.vhosts.get(end.vhost)
        if held is not None and end.queue in held.queues:  # not a transient one, gone
            records.gray_ends[(end.vhost, end.queue)] = end
    routes.load(document.get("routes", []))  # absent from files before routes
    return floor
