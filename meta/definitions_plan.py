"""Definitions import, step one: check a parsed document against the current state and
list what must change, without changing anything.

The rules queue.declare, exchange.declare and queue.bind apply (meta.checks,
meta.queue_arguments) run here on the whole file first, so an import is all-or-nothing:
a file with one bad entity is refused with every problem named by its place in the file
("queues[3]: inequivalent arg 'durable' ..."). What already exists and is equivalent is
counted as present and left alone, so importing a node's own export changes nothing.

Unlike RabbitMQ, which keeps an existing queue or exchange whatever the file says, a
non-equivalent one is an error here (the node would silently differ from the file).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from meta import checks
from meta.definitions import (
    IGNORED_KINDS,
    KINDS,
    BindingIn,
    DefinitionsError,
    DefinitionsIn,
    ExchangeIn,
    ImportPlan,
    PermissionIn,
    PolicyIn,
    QueueIn,
    UserIn,
    VHostIn,
)
from meta.errors import (
    AccessRefused,
    MetaError,
    exchange_not_found,
    queue_not_found,
    resource_name,
)
from meta.models import (
    BUILTIN_EXCHANGE_TYPES,
    DELAYED_MESSAGE_EXCHANGE_TYPE,
    PREDECLARED_EXCHANGES,
    BindingDef,
    ExchangeDef,
    Permission,
    Policy,
    QueueDef,
    User,
    VHostLimits,
)
from meta.partitions import (
    PolicyInvalid,
    check_policy_definition,
    check_policy_on_queues,
    initial_partitions,
    policy_in_force,
)
from meta.password import (
    ALGORITHMS,
    MD5_ALGORITHM,
    SHA256_ALGORITHM,
    check_password,
    hash_password,
)
from meta.queue_arguments import check_queue_arguments
from meta.state import augment_queue_arguments
from meta.store import MetadataStore
from meta.vhost_limits import PARAMETER_NAME, LimitsInvalid, check_limits, is_limits_parameter

_PREDECLARED = {name: (type_, internal) for name, type_, internal in PREDECLARED_EXCHANGES}
_E = TypeVar("_E")


class _Refused(Exception):
    """One entity's problem; ``where`` is appended to its path (".name", "")."""

    def __init__(self, where: str, text: str) -> None:
        super().__init__(text)
        self.where, self.text = where, text


def default_hashing_algorithm(version: str | None) -> str:
    """rabbit_auth_backend_internal:hashing_algorithm/2 for users without one."""
    if version is not None and re.match(r"3\.[0-5]\.", version):
        return MD5_ALGORITHM
    return SHA256_ALGORITHM


def _check_regex(where: str, pattern: str) -> None:
    try:
        re.compile(pattern)
    except re.error as error:
        raise _Refused(where, f"invalid regular expression '{pattern}': {error}") from None


def _check_name(kind: str, name: str) -> None:
    if not name:
        raise _Refused(".name", f"a {kind} name must not be empty")


def _check_password_hash(password_hash: str, algorithm: str) -> None:
    digest = ALGORITHMS.get(algorithm)
    if digest is None:
        supported = ", ".join(sorted(ALGORITHMS))
        text = f"unsupported hashing algorithm '{algorithm}' (supported: {supported})"
        raise _Refused(".hashing_algorithm", text)
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except (binascii.Error, ValueError):
        raise _Refused(".password_hash", "not valid base64") from None
    expected = 4 + hashlib.new(digest).digest_size
    if len(raw) != expected:
        text = f"a {algorithm} hash has {expected} bytes (4 of salt), this one {len(raw)}"
        raise _Refused(".password_hash", text)


def _same_user(current: User | None, new: User, password: str | None) -> bool:
    """Whether replacing ``current`` by ``new`` changes nothing (a clear-text password in
    the file was hashed with a fresh salt, so it is compared by checking it)."""
    if current is None or password is None:
        return current == new
    same_password = check_password(password, current.password_hash, current.hashing_algorithm)
    return same_password and current.tags == new.tags


class _Planner:
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
            except _Refused as refused:
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
            raise _Refused(".vhost", "Field required")
        if given not in self.node_vhosts and given not in self.new_vhosts:
            raise _Refused("", f"no vhost '{given}' (not on the node, not in the file)")
        return given

    def replacing(self, kind: str, current: Any, new: Any, into: list[Any]) -> None:
        if current == new:
            self.count(kind, "present")
            return
        self.count(kind, "created" if current is None else "updated")
        into.append(new)

    # --- vhosts, users, permissions, policies ----------------------------------------------

    async def vhost(self, entry: VHostIn) -> None:
        _check_name("vhost", entry.name)
        if entry.name in self.node_vhosts or entry.name in self.new_vhosts:
            self.count("vhosts", "present")
            return
        self.new_vhosts.add(entry.name)
        self.plan.vhosts.append(entry.definition())
        self.count("vhosts", "created")

    async def user(self, entry: UserIn) -> None:
        _check_name("user", entry.name)
        if entry.password is not None and entry.password_hash is not None:
            raise _Refused("", "both_password_and_password_hash_are_provided")
        tags = tuple(entry.tags)
        if entry.password is not None:  # RabbitMQ takes a clear-text password too
            user = User(name=entry.name, password_hash=hash_password(entry.password), tags=tags)
        else:
            algorithm = entry.hashing_algorithm or default_hashing_algorithm(self.doc.version)
            if entry.password_hash:  # none or "": a user that cannot log in with a password
                _check_password_hash(entry.password_hash, algorithm)
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
            if _same_user(current, user, password):
                self.count("users", "present")
            else:
                self.count("users", "created" if current is None else "updated")
                self.plan.users.append(user)

    async def permission(self, entry: PermissionIn) -> None:
        vhost = self.vhost_of(entry.vhost)
        if entry.user not in self.users and await self.store.get_user(entry.user) is None:
            raise _Refused("", f"no user '{entry.user}' (not on the node, not in the file)")
        for kind in ("configure", "write", "read"):
            _check_regex(f".{kind}", getattr(entry, kind))
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
        _check_name("policy", entry.name)
        _check_regex(".pattern", entry.pattern)
        data = entry.model_dump(by_alias=True)
        policy = Policy.model_validate({**data, "vhost": vhost})
        try:
            check_policy_definition(policy.definition)
            if vhost in self.node_vhosts:
                check_policy_on_queues(policy, await self.node_queues(vhost))
        except PolicyInvalid as error:
            raise _Refused(".definition", str(error)) from None
        self.policies[(vhost, entry.name)] = policy

    async def node_queues(self, vhost: str) -> list[QueueDef]:
        known = self.queues_on_node.get(vhost)
        if known is None:
            known = self.queues_on_node[vhost] = await self.store.list_queues(vhost)
        return known

    async def policies_in_force(self, vhost: str) -> list[Policy]:
        """The vhost's policies once the file's are set (queues are planned after them)."""
        known = self.in_force.get(vhost)
        if known is None:
            on_node = await self.store.list_policies(vhost) if vhost in self.node_vhosts else []
            merged = {p.name: p for p in on_node}
            merged.update({name: p for (v, name), p in self.policies.items() if v == vhost})
            known = self.in_force[vhost] = list(merged.values())
        return known

    async def parameter(self, entry: dict[str, Any]) -> None:
        """A "vhost-limits" parameter (the others are ignored, counted as such)."""
        if not is_limits_parameter(entry):
            return
        vhost = self.vhost_of(entry.get("vhost"))
        if entry.get("name") != PARAMETER_NAME:
            raise _Refused(".name", f"vhost limits are named '{PARAMETER_NAME}'")
        try:
            limits = check_limits(entry.get("value"))
        except LimitsInvalid as error:
            raise _Refused(".value", f"Validation failed: {error}") from None
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

    # --- exchanges, queues, bindings -----------------------------------------------------

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
            raise _Refused(".type", f"unknown exchange type '{entry.type}'")
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
        _check_name("queue", entry.name)
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
