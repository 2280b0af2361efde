"""Users' permissions per vhost, compiled once and kept in step with the metadata store.

RabbitMQ's model: a user may use a vhost only with a permission entry there; each entry holds
three regexes (configure, write, read) matched against resource names; ``^$`` matches
nothing and the empty string is the same as ``^$``. The AMQP handlers ask on every
operation, so the regexes are compiled here and the lookups are plain dict reads; every change
made through the admin API goes through this object, which writes the store first.

rabbit_auth_backend_internal:check_resource_access/4 (3.10) runs ``re:run(Name, Regexp,
[{capture, none}])`` on binaries without the ``unicode`` option: byte semantics, an unanchored
search. The patterns here are compiled as bytes and searched in the UTF-8 name to match.

A connection holds the ``Grants`` of its (user, vhost): decisions cached per resource name,
so a publish costs a dict read. rabbit_channel caches its last 12 decisions per channel, so a
change reaches at least new channels; here a change resets the Grants in place and reaches
every channel at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from gateway.amqp.errors import AccessRefused
from meta.models import Permission, User
from meta.store import MetadataStore

Kind = Literal["configure", "write", "read"]


@dataclass(frozen=True, slots=True)
class Regex:
    """A permission regex, searched as re:run searches a binary (bytes, unanchored)."""

    binary: re.Pattern[bytes] | None
    text: re.Pattern[str] | None  # only if the bytes compile failed (e.g. \u escapes)

    @classmethod
    def of(cls, regex: str) -> Regex | None:
        # RabbitMQ: "" is treated as "^$", which no resource name matches (names checked
        # are never empty: the default exchange is checked as "amq.default").
        if regex in ("", "^$"):
            return None
        try:
            return cls(re.compile(regex.encode()), None)
        except re.error:
            return cls(None, re.compile(regex))

    def search(self, name: str) -> bool:
        if self.binary is not None:
            return self.binary.search(name.encode()) is not None
        assert self.text is not None
        return self.text.search(name) is not None


@dataclass(frozen=True, slots=True)
class CompiledPermission:
    source: Permission
    configure: Regex | None  # None: matches nothing
    write: Regex | None
    read: Regex | None

    @classmethod
    def of(cls, permission: Permission) -> CompiledPermission:
        return cls(
            permission,
            Regex.of(permission.configure),
            Regex.of(permission.write),
            Regex.of(permission.read),
        )

    def allows(self, kind: Kind, name: str) -> bool:
        pattern: Regex | None = getattr(self, kind)
        return pattern is not None and pattern.search(name)


def refused_text(resource_kind: str, name: str, vhost: str, user: str) -> str:
    """rabbit_access_control's text for a denied operation (without the ACCESS_REFUSED -)."""
    return f"access to {resource_kind} '{name}' in vhost '{vhost}' refused for user '{user}'"


MAX_CACHED_DECISIONS = 4096  # per kind and Grants; a client naming endless resources resets it


class Grants:
    """One user's rights in one vhost, with every decision cached by resource name.

    Hot paths read ``grants.write.get(name)`` (True, False, or None: not decided yet, call
    ``check``). The default exchange "" is decided as "amq.default", as
    rabbit_access_control:check_resource_access/4 renames it before asking the backend.
    """

    __slots__ = ("configure", "permission", "read", "user", "vhost", "write")

    def __init__(self, user: str, vhost: str, permission: CompiledPermission | None) -> None:
        self.user = user
        self.vhost = vhost
        self.permission = permission
        self.configure: dict[str, bool] = {}
        self.write: dict[str, bool] = {}
        self.read: dict[str, bool] = {}

    def reset(self, permission: CompiledPermission | None) -> None:
        """The permission changed (or went): forget every decision."""
        self.permission = permission
        self.configure.clear()
        self.write.clear()
        self.read.clear()

    def check(self, kind: Kind, name: str) -> bool:
        cache: dict[str, bool] = getattr(self, kind)
        decision = cache.get(name)
        if decision is None:
            permission = self.permission
            decision = permission is not None and permission.allows(kind, name or "amq.default")
            if len(cache) >= MAX_CACHED_DECISIONS:
                cache.clear()
            cache[name] = decision
        return decision

    def require(
        self, kind: Kind, resource_kind: str, name: str, class_id: int, method_id: int
    ) -> None:
        """rabbit_channel:check_<kind>_permitted/3: 403 ACCESS_REFUSED closes the channel."""
        if not self.check(kind, name):
            text = refused_text(resource_kind, name or "amq.default", self.vhost, self.user)
            raise AccessRefused(text, class_id, method_id)


NO_GRANTS = Grants("", "", None)  # before a vhost is open: nothing is allowed


class Access:
    def __init__(self, meta: MetadataStore) -> None:
        self.meta = meta
        self._permissions: dict[tuple[str, str], CompiledPermission] = {}
        self._grants: dict[tuple[str, str], Grants] = {}  # handed to connections, kept current

    async def load(self) -> None:
        self._permissions = {
            (p.user, p.vhost): CompiledPermission.of(p) for p in await self.meta.list_permissions()
        }
        for key, grants in self._grants.items():
            grants.reset(self._permissions.get(key))

    def grants(self, user: str, vhost: str) -> Grants:
        """The rights of ``user`` in ``vhost``; the object stays current across changes."""
        key = (user, vhost)
        grants = self._grants.get(key)
        if grants is None:
            grants = self._grants[key] = Grants(user, vhost, self._permissions.get(key))
        return grants

    def _changed(self, key: tuple[str, str]) -> None:
        grants = self._grants.get(key)
        if grants is not None:
            grants.reset(self._permissions.get(key))

    def may_use_vhost(self, user: str, vhost: str) -> bool:
        return (user, vhost) in self._permissions

    async def set_permission(self, permission: Permission) -> None:
        compiled = CompiledPermission.of(permission)  # a bad regex fails before the store
        await self.meta.set_permission(permission)
        key = (permission.user, permission.vhost)
        self._permissions[key] = compiled
        self._changed(key)

    async def clear_permission(self, user: str, vhost: str) -> None:
        await self.meta.clear_permission(user, vhost)
        self._permissions.pop((user, vhost), None)
        self._changed((user, vhost))

    async def delete_user(self, name: str) -> bool:
        deleted = await self.meta.delete_user(name)
        for key in [k for k in self._permissions if k[0] == name]:
            del self._permissions[key]
        for key, grants in self._grants.items():
            if key[0] == name:
                grants.reset(None)
        return deleted

    def forget_vhost(self, vhost: str) -> None:
        """The vhost is gone (the store dropped its permissions with it)."""
        for key in [k for k in self._permissions if k[1] == vhost]:
            del self._permissions[key]
        for key, grants in self._grants.items():
            if key[1] == vhost:
                grants.reset(None)

    async def put_user(self, user: User) -> None:
        await self.meta.put_user(user)
