"""Definitions import: what the planner of one import keeps while it checks the file.

``PlannerBase`` holds the document, the store it is checked against (read only), the plan
being built and the problems found so far, and what the file declares as it goes (so a later
entry can refer to an earlier one). Its helpers are shared by every kind of entry: walking
one list of the file with each entry's place recorded, counting outcomes, resolving an
entry's vhost, and the policies a vhost will have once the file's are set. The entries'
own checks are in meta.definitions_plan (vhosts, users, permissions, policies, limits) and
meta.definitions_topology_plan (exchanges, queues, bindings).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from meta.definitions import DefinitionsIn, ImportPlan
from meta.definitions_checks import Refused
from meta.errors import MetaError
from meta.models import (
    ExchangeDef,
    Permission,
    Policy,
    QueueDef,
    User,
    VHostLimits,
)
from meta.store import MetadataStore

_E = TypeVar("_E")


class PlannerBase:
    """One import being checked: its inputs, what the file declared so far, the plan."""

    def __init__(
        self,
        doc: DefinitionsIn,
        store: MetadataStore,
        scope: str | None,
        exchange_types: frozenset[str],
        max_topic_hash_wildcards: int | None,
        default_partitions: int,
    ) -> None:
        self.doc = doc
        self.store = store
        self.scope = scope  # the vhost of a per-vhost import
        self.exchange_types = exchange_types
        self.max_topic_hash_wildcards = max_topic_hash_wildcards
        self.default_partitions = default_partitions  # the node's queue_partitions
        self.plan = ImportPlan()
        self.errors: list[str] = []
        self.node_vhosts: set[str] = {scope} if scope is not None else set()
        self.new_vhosts: set[str] = set()
        self.users: dict[str, tuple[User, str | None]] = {}  # valid users of the file
        self.permissions: dict[tuple[str, str], Permission] = {}
        self.policies: dict[tuple[str, str], Policy] = {}
        self.in_force: dict[str, list[Policy]] = {}  # vhost -> its policies after the import
        self.queues_on_node: dict[str, list[QueueDef]] = {}
        self.limits: dict[str, VHostLimits] = {}
        self.exchanges: dict[tuple[str, str], ExchangeDef] = {}  # created by this file
        self.queues: dict[tuple[str, str], QueueDef] = {}
        self.bindings: set[tuple[str, Any]] = set()
        self.bound_by_source: dict[tuple[str, str], set[Any]] = {}  # bindings on the node
        self.path = ""  # of the entry being checked

    async def each(
        self, kind: str, entries: Sequence[_E], check: Callable[[_E], Awaitable[None]]
    ) -> None:
        for i, entry in enumerate(entries):
            self.path = f"{kind}[{i}]"
            try:
                await check(entry)
            except Refused as refused:
                self.errors.append(f"{self.path}{refused.where}: {refused.text}")
            except MetaError as error:
                self.errors.append(f"{self.path}: {error.detail}")

    def count(self, kind: str, outcome: str) -> None:
        self.plan.counts[kind][outcome] += 1

    def vhost_of(self, given: str | None) -> str:
        """The entity's vhost: the per-vhost import's, or its own, which must exist."""
        if self.scope is not None:
            return self.scope
        if given is None:
            raise Refused(".vhost", "Field required")
        if given not in self.node_vhosts and given not in self.new_vhosts:
            raise Refused("", f"no vhost '{given}' (not on the node, not in the file)")
        return given

    def replacing(self, kind: str, current: Any, new: Any, into: list[Any]) -> None:
        if current == new:
            self.count(kind, "present")
            return
        self.count(kind, "created" if current is None else "updated")
        into.append(new)

    async def policies_in_force(self, vhost: str) -> list[Policy]:
        """The vhost's policies once the file's are set (queues are planned after them)."""
        known = self.in_force.get(vhost)
        if known is None:
            on_node = await self.store.list_policies(vhost) if vhost in self.node_vhosts else []
            merged = {p.name: p for p in on_node}
            merged.update({name: p for (v, name), p in self.policies.items() if v == vhost})
            known = self.in_force[vhost] = list(merged.values())
        return known
