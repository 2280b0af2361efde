"""The change feed: every metadata mutation, in order, for the caches that follow it.

A store appends ``Change`` items in the same atomic step as the mutation they describe
(Redis: in the transaction's MULTI/EXEC; local: in the same synchronous stretch of code).
A follower reads them from the last id it saw. When it cannot know what it missed (the
feed was trimmed past that id, or Redis restarted) it gets ``Reload`` instead, reloads
everything from the store, and continues from ``Reload.position``. Changes between that
position and the reload are delivered again: applying a change must be idempotent
(declared = upsert, deleted = remove if present), which every kind here is.

Documents use the stores' JSON shape (meta.serialization); ``Change.entity()`` decodes one.
Deletions with cascades become one change per removed thing: bindings first, then queues,
then exchanges. A new vhost is ``vhost.added`` followed by its predeclared exchanges. A
queue's gray release end (GrayEnd) and its versioned route (QueueRoute) go with the queue, or
its vhost, without a change of their own: ``queue.deleted`` and ``vhost.deleted`` say it.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal, cast, get_args

import anyio
from pydantic import BaseModel

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
from meta.serialization import dump, load

ChangeKind = Literal[
    "vhost.added",
    "vhost.updated",  # description, tags or tracing replaced
    "vhost.deleted",
    "exchange.declared",
    "exchange.deleted",
    "queue.declared",
    "queue.deleted",
    "binding.added",
    "binding.removed",
    "user.put",
    "user.deleted",
    "permission.set",
    "permission.cleared",
    "policy.put",
    "policy.deleted",
    "control.put",
    "control.deleted",
    "vhost_limits.set",  # a vhost's limits replaced (meta.vhost_limits)
    "vhost_limits.cleared",  # dropped with their vhost
    "gray_rule.set",  # an operator's gray release rule created or replaced
    "gray_rule.deleted",
    "gray_end.set",  # a queue's gray release ended (mqgw ctl gray end)
    "gray_end.deleted",  # resumed; a queue's deletion (or its vhost's) drops it silently
    "route.set",  # a keyed-order queue's route, new version or partition state (compare-and-set)
    "placement.set",  # cluster only: document {"partitions": [group, ...]}
]
CHANGE_KINDS: frozenset[str] = frozenset(get_args(ChangeKind))
_MODELS: dict[str, type[BaseModel]] = {
    "vhost": VHost,
    "exchange": ExchangeDef,
    "queue": QueueDef,
    "binding": BindingDef,
    "user": User,
    "permission": Permission,
    "policy": Policy,
    "control": ConsumptionControl,
    "vhost_limits": VHostLimits,
    "gray_rule": GrayRule,
    "gray_end": GrayEnd,
    "route": QueueRoute,
}
DEFAULT_LOCAL_FEED_LENGTH = 10_000  # an embedded node rarely follows; keep memory small


@dataclass(frozen=True)
class Change:
    """One mutation. ``name`` is the entity's name (a binding's source, a permission's
    user); ``document`` the entity as stored (as it was, for deletions)."""

    kind: ChangeKind
    vhost: str
    name: str
    document: dict[str, Any] | None = None
    id: str = ""  # the feed position; assigned when the store appends it

    def entity(self) -> BaseModel | None:
        model = _MODELS.get(self.kind.partition(".")[0])
        if model is None or self.document is None:
            return None
        return load(model, self.document)

    def to_fields(self) -> dict[str, str]:
        """The Redis stream entry."""
        document = "" if self.document is None else json.dumps(self.document, sort_keys=True)
        return {"kind": self.kind, "vhost": self.vhost, "name": self.name, "doc": document}

    @classmethod
    def from_fields(cls, entry_id: str, fields: dict[str, str]) -> Change:
        kind = fields["kind"]
        if kind not in CHANGE_KINDS:
            raise ValueError(f"unknown change kind {kind!r} in entry {entry_id}")
        document = json.loads(fields["doc"]) if fields.get("doc") else None
        return cls(cast(ChangeKind, kind), fields["vhost"], fields["name"], document, entry_id)


@dataclass(frozen=True)
class Reload:
    """The follower may have missed changes: reload everything now. Following goes on with
    the changes after ``position`` (some may already be in what the reload reads)."""

    reason: str
    position: str


ChangeEvent = Change | Reload


def _address(model: BaseModel) -> tuple[str, str]:
    """(vhost, name) of a change about ``model``."""
    if isinstance(model, VHost):
        return model.name, model.name
    if isinstance(model, VHostLimits):
        return model.vhost, model.vhost
    if isinstance(model, BindingDef):
        return model.vhost, model.source
    if isinstance(model, User | GrayRule):
        return "", model.name
    if isinstance(model, Permission):
        return model.vhost, model.user
    if isinstance(model, GrayEnd | QueueRoute):
        return model.vhost, model.queue
    if isinstance(model, ExchangeDef | QueueDef | Policy | ConsumptionControl):
        return model.vhost, model.name
    raise TypeError(f"no change kind for {type(model).__name__}")


def change(kind: ChangeKind, model: BaseModel) -> Change:
    vhost, name = _address(model)
    return Change(kind, vhost, name, dump(model))


def deletion_changes(deletions: Deletions) -> list[Change]:
    return [
        *(change("binding.removed", b) for b in deletions.bindings),
        *(change("queue.deleted", q) for q in deletions.queues),
        *(change("exchange.deleted", x) for x in deletions.exchanges),
    ]


def vhost_added_changes(vhost: VHost, exchanges: Iterable[ExchangeDef]) -> list[Change]:
    return [change("vhost.added", vhost), *(change("exchange.declared", x) for x in exchanges)]


def vhost_deleted_changes(
    vhost: VHost,
    deletions: Deletions,
    dropped: Iterable[Permission | Policy | ConsumptionControl | VHostLimits],
) -> list[Change]:
    """The vhost's contents first, then what referred to it, then the vhost itself."""
    kinds: dict[type[BaseModel], ChangeKind] = {
        Permission: "permission.cleared",
        Policy: "policy.deleted",
        ConsumptionControl: "control.deleted",
        VHostLimits: "vhost_limits.cleared",
    }
    return [
        *deletion_changes(deletions),
        *(change(kinds[type(item)], item) for item in dropped),
        change("vhost.deleted", vhost),
    ]


class MemoryChangeFeed:
    """The local store's feed: the last ``max_len`` changes in memory, ids "1", "2", ...

    Ids restart with the process, as every follower of an in-process store does.
    """

    def __init__(self, max_len: int = DEFAULT_LOCAL_FEED_LENGTH) -> None:
        self._entries: deque[Change] = deque(maxlen=max_len)
        self._last_seq = 0
        self._wakeup: anyio.Event | None = None  # created by a waiting follower (async)

    def publish(self, changes: Iterable[Change]) -> None:
        for item in changes:
            self._last_seq += 1
            self._entries.append(replace(item, id=str(self._last_seq)))
        if self._wakeup is not None:
            self._wakeup.set()
            self._wakeup = None

    def position(self) -> str:
        return str(self._last_seq)

    def _gap(self, seq: int | None) -> str | None:
        if seq is None:
            return "unknown change id"
        if seq > self._last_seq:
            return "change id from another store instance"
        first_kept = self._last_seq - len(self._entries) + 1
        if seq < first_kept - 1:
            return "changes trimmed from the feed"
        return None

    async def follow(self, last_id: str | None = None) -> AsyncGenerator[ChangeEvent, None]:
        seq: int | None = self._last_seq
        if last_id is not None:
            seq = int(last_id) if last_id.isdigit() else None
        while True:
            reason = self._gap(seq)
            if reason is not None:
                seq = self._last_seq
                yield Reload(reason, str(seq))
                continue
            assert seq is not None
            if seq == self._last_seq:
                if self._wakeup is None:
                    self._wakeup = anyio.Event()
                await self._wakeup.wait()
                continue
            # Copy the batch first: publishing while we yield may drop old entries.
            newer = list(itertools.islice(reversed(self._entries), self._last_seq - seq))
            for item in reversed(newer):
                yield item
                seq = int(item.id)
