"""Definitions import, step one: check a parsed document against the current state and
list what must change, without changing anything.

The rules queue.declare, exchange.declare and queue.bind apply (meta.checks,
meta.queue_arguments) run here on the whole file first, so an import is all-or-nothing:
a file with one bad entity is refused with every problem named by its place in the file
("queues[3]: inequivalent arg 'durable' ..."). What already exists and is equivalent is
counted as present and left alone, so importing a node's own export changes nothing.

Unlike RabbitMQ, which keeps an existing queue or exchange whatever the file says, a
non-equivalent one is an error here (the node would silently differ from the file).

The checks of one entry alone are in meta.definitions_checks, those of exchanges, queues and
bindings in meta.definitions_topology_plan; this module checks the rest and runs the whole.
"""

from __future__ import annotations

from typing import Any

from meta import checks
from meta.definitions import (
    IGNORED_KINDS,
    KINDS,
    DefinitionsError,
    DefinitionsIn,
    ImportPlan,
    PermissionIn,
    PolicyIn,
    UserIn,
    VHostIn,
)
from meta.definitions_checks import (
    Refused,
    check_name,
    check_password_hash,
    check_regex,
    default_hashing_algorithm,
    same_user,
)
from meta.definitions_topology_plan import TopologyPlanning
from meta.models import BUILTIN_EXCHANGE_TYPES, Permission, Policy, QueueDef, User, VHostLimits
from meta.partitions import PolicyInvalid, check_policy_definition, check_policy_on_queues
from meta.password import hash_password
from meta.store import MetadataStore
from meta.vhost_limits import PARAMETER_NAME, LimitsInvalid, check_limits, is_limits_parameter


class _Planner(TopologyPlanning):
    """One import's checks: vhosts, users, permissions, policies and limits here; exchanges,
    queues and bindings in meta.definitions_topology_plan; the shared state in
    meta.definitions_planner."""

    # --- vhosts, users, permissions, policies ----------------------------------------------

    async def vhost(self, entry: VHostIn) -> None:
        check_name("vhost", entry.name)
        if entry.name in self.node_vhosts or entry.name in self.new_vhosts:
            self.count("vhosts", "present")
            return
        self.new_vhosts.add(entry.name)
        self.plan.vhosts.append(entry.definition())
        self.count("vhosts", "created")

    async def user(self, entry: UserIn) -> None:
        check_name("user", entry.name)
        if entry.password is not None and entry.password_hash is not None:
            raise Refused("", "both_password_and_password_hash_are_provided")
        tags = tuple(entry.tags)
        if entry.password is not None:  # RabbitMQ takes a clear-text password too
            user = User(name=entry.name, password_hash=hash_password(entry.password), tags=tags)
        else:
            algorithm = entry.hashing_algorithm or default_hashing_algorithm(self.doc.version)
            if entry.password_hash:  # none or "": a user that cannot log in with a password
                check_password_hash(entry.password_hash, algorithm)
            user = User(
                name=entry.name,
                password_hash=entry.password_hash or "",
                hashing_algorithm=algorithm,
                tags=tags,
            )
        self.users[user.name] = (user, entry.password)  # a later entry wins

    async def plan_users(self) -> None:
        for user, password in self.users.values():
            current = await self.store.get_user(user.name)
            if same_user(current, user, password):
                self.count("users", "present")
            else:
                self.count("users", "created" if current is None else "updated")
                self.plan.users.append(user)

    async def permission(self, entry: PermissionIn) -> None:
        vhost = self.vhost_of(entry.vhost)
        if entry.user not in self.users and await self.store.get_user(entry.user) is None:
            raise Refused("", f"no user '{entry.user}' (not on the node, not in the file)")
        for kind in ("configure", "write", "read"):
            check_regex(f".{kind}", getattr(entry, kind))
        permission = Permission(
            user=entry.user,
            vhost=vhost,
            configure=entry.configure,
            write=entry.write,
            read=entry.read,
        )
        self.permissions[(entry.user, vhost)] = permission

    async def policy(self, entry: PolicyIn) -> None:
        vhost = self.vhost_of(entry.vhost)
        check_name("policy", entry.name)
        check_regex(".pattern", entry.pattern)
        data = entry.model_dump(by_alias=True)
        policy = Policy.model_validate({**data, "vhost": vhost})
        try:
            check_policy_definition(policy.definition)
            if vhost in self.node_vhosts:
                check_policy_on_queues(policy, await self.node_queues(vhost))
        except PolicyInvalid as error:
            raise Refused(".definition", str(error)) from None
        self.policies[(vhost, entry.name)] = policy

    async def node_queues(self, vhost: str) -> list[QueueDef]:
        known = self.queues_on_node.get(vhost)
        if known is None:
            known = self.queues_on_node[vhost] = await self.store.list_queues(vhost)
        return known

    async def parameter(self, entry: dict[str, Any]) -> None:
        """A "vhost-limits" parameter (the others are ignored, counted as such)."""
        if not is_limits_parameter(entry):
            return
        vhost = self.vhost_of(entry.get("vhost"))
        if entry.get("name") != PARAMETER_NAME:
            raise Refused(".name", f"vhost limits are named '{PARAMETER_NAME}'")
        try:
            limits = check_limits(entry.get("value"))
        except LimitsInvalid as error:
            raise Refused(".value", f"Validation failed: {error}") from None
        self.limits[vhost] = VHostLimits(vhost=vhost, limits=limits)

    async def plan_replacements(self) -> None:
        for (user, vhost), permission in self.permissions.items():
            current = await self.store.get_permission(user, vhost)
            self.replacing("permissions", current, permission, self.plan.permissions)
        policies = {(p.vhost, p.name): p for p in await self.store.list_policies(self.scope)}
        for key, policy in self.policies.items():
            self.replacing("policies", policies.get(key), policy, self.plan.policies)
        for vhost, limits in self.limits.items():
            known = None if vhost in self.new_vhosts else await self.store.get_vhost_limits(vhost)
            outcome = "present" if known == limits else "updated" if known else "created"
            self.plan.limits_counts[outcome] += 1
            if outcome != "present":
                self.plan.vhost_limits.append(limits)


async def plan_import(
    doc: DefinitionsIn,
    store: MetadataStore,
    *,
    vhost: str | None = None,
    exchange_types: frozenset[str] = BUILTIN_EXCHANGE_TYPES,
    max_topic_hash_wildcards: int | None = checks.MAX_TOPIC_HASH_WILDCARDS,
    default_partitions: int = 1,
) -> ImportPlan:
    """Check ``doc`` against ``store`` (read only); raises DefinitionsError naming every
    problem. ``vhost``: a per-vhost import (users, vhosts and permissions are ignored, every
    entity goes to ``vhost``, which must exist). ``default_partitions``: the node's, for new
    queues that neither their argument nor a policy gives a count."""
    planner = _Planner(
        doc, store, vhost, exchange_types, max_topic_hash_wildcards, default_partitions
    )
    plan = planner.plan
    ignored = IGNORED_KINDS if vhost is None else (*IGNORED_KINDS, *KINDS[:3])
    for kind in ignored:
        entries = getattr(doc, kind)
        if kind == "parameters":  # vhost limits are imported
            entries = [e for e in entries if not is_limits_parameter(e)]
        if entries:
            plan.ignored[kind] = len(entries)
    if vhost is None:
        planner.node_vhosts = {v.name for v in await store.list_vhosts()}
        await planner.each("vhosts", doc.vhosts, planner.vhost)
        await planner.each("users", doc.users, planner.user)
        await planner.each("permissions", doc.permissions, planner.permission)
    await planner.each("policies", doc.policies, planner.policy)
    await planner.each("parameters", doc.parameters, planner.parameter)
    await planner.each("exchanges", doc.exchanges, planner.exchange)
    await planner.each("queues", doc.queues, planner.queue)
    await planner.each("bindings", doc.bindings, planner.binding)
    if planner.errors:
        raise DefinitionsError(planner.errors)
    await planner.plan_users()
    await planner.plan_replacements()
    return plan
