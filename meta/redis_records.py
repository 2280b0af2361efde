"""Users, permissions, policies and consumption controls in Redis: one hash each.

They are few and change rarely, so a whole hash is the WATCH unit. Writes that need no
read (put_user, put_control) are blind HSETs; the others watch what they check.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel

from meta.change_feed import Change, ChangeKind, change
from meta.errors import vhost_not_found
from meta.models import ConsumptionControl, Permission, Policy, User
from meta.redis_base import RedisStoreBase
from meta.redis_topology import TopologyView, Tx
from meta.serialization import dumps, key_of, loads, parse_key


class RecordsMixin(RedisStoreBase):
    # --- users ---

    async def list_users(self) -> list[User]:
        texts = await self._read(lambda: self._conn.client.hvals(self._keys.users))
        return sorted((loads(User, t) for t in texts), key=lambda u: u.name)

    async def get_user(self, name: str) -> User | None:
        text = await self._read(lambda: self._conn.client.hget(self._keys.users, name))
        return None if text is None else loads(User, text)

    async def put_user(self, user: User) -> None:
        async def body(view: TopologyView) -> None:
            self._write_user(view.tx, user)

        await self._transact(body)

    async def delete_user(self, name: str) -> bool:
        async def body(view: TopologyView) -> bool:
            text = await view.tx.hget(self._keys.users, name)
            if text is None:
                return False
            permissions = await view.tx.hgetall(self._keys.permissions)
            dropped = [f for f in permissions if parse_key(f)[0] == name]
            if dropped:
                view.tx.write("HDEL", self._keys.permissions, *dropped)
            view.tx.write("HDEL", self._keys.users, name)
            cleared = [
                change("permission.cleared", loads(Permission, permissions[f])) for f in dropped
            ]
            view.tx.publish([*cleared, change("user.deleted", loads(User, text))])
            return True

        return await self._transact(body)

    # --- permissions ---

    async def set_permission(self, permission: Permission) -> None:
        async def body(view: TopologyView) -> None:
            if await view.vhost(permission.vhost) is None:
                raise vhost_not_found(permission.vhost)
            self._write_permission(view.tx, permission)

        await self._transact(body)

    async def clear_permission(self, user: str, vhost: str) -> None:
        field = key_of(user, vhost)
        await self._remove(self._keys.permissions, field, _as("permission.cleared", Permission))

    async def get_permission(self, user: str, vhost: str) -> Permission | None:
        field = key_of(user, vhost)
        text = await self._read(lambda: self._conn.client.hget(self._keys.permissions, field))
        return None if text is None else loads(Permission, text)

    async def list_permissions(self, vhost: str | None = None) -> list[Permission]:
        texts = await self._read(lambda: self._conn.client.hvals(self._keys.permissions))
        found = (loads(Permission, t) for t in texts)
        selected = [p for p in found if vhost is None or p.vhost == vhost]
        return sorted(selected, key=lambda p: (p.user, p.vhost))

    # --- policies ---

    async def put_policy(self, policy: Policy) -> None:
        async def body(view: TopologyView) -> None:
            if await view.vhost(policy.vhost) is None:
                raise vhost_not_found(policy.vhost)
            field = key_of(policy.vhost, policy.name)
            view.tx.write("HSET", self._keys.policies, field, dumps(policy))
            view.tx.publish([change("policy.put", policy)])

        await self._transact(body)

    async def delete_policy(self, vhost: str, name: str) -> bool:
        field = key_of(vhost, name)
        return await self._remove(self._keys.policies, field, _as("policy.deleted", Policy))

    async def list_policies(self, vhost: str | None = None) -> list[Policy]:
        texts = await self._read(lambda: self._conn.client.hvals(self._keys.policies))
        found = (loads(Policy, t) for t in texts)
        selected = [p for p in found if vhost is None or p.vhost == vhost]
        return sorted(selected, key=lambda p: (p.vhost, p.name))

    # --- consumption controls ---

    async def put_control(self, control: ConsumptionControl) -> None:
        async def body(view: TopologyView) -> None:
            field = key_of(*control.key)
            view.tx.write("HSET", self._keys.controls, field, dumps(control))
            view.tx.publish([change("control.put", control)])

        await self._transact(body)

    async def delete_control(self, scope: str, vhost: str, name: str) -> bool:
        field = key_of(scope, vhost, name)
        removed = _as("control.deleted", ConsumptionControl)
        return await self._remove(self._keys.controls, field, removed)

    async def list_controls(self) -> list[ConsumptionControl]:
        texts = await self._read(lambda: self._conn.client.hvals(self._keys.controls))
        return sorted((loads(ConsumptionControl, t) for t in texts), key=lambda c: c.key)

    # --- shared ---

    async def _remove(self, key: str, field: str, removed: Callable[[str], Change]) -> bool:
        """HDEL one record if present, with its change; False if it was not there."""

        async def body(view: TopologyView) -> bool:
            text = await view.tx.hget(key, field)
            if text is None:
                return False
            view.tx.write("HDEL", key, field)
            view.tx.publish([removed(text)])
            return True

        return await self._transact(body)

    async def _records_of_vhost(
        self, tx: Tx, vhost: str
    ) -> list[Permission | Policy | ConsumptionControl]:
        """Drop (in ``tx``) what refers to ``vhost``: permissions, policies, queue controls."""
        keys = self._keys
        permissions = await tx.hgetall(keys.permissions)
        policies = await tx.hgetall(keys.policies)
        controls = await tx.hgetall(keys.controls)
        in_permissions = [f for f in permissions if parse_key(f)[1] == vhost]
        in_policies = [f for f in policies if parse_key(f)[0] == vhost]
        in_controls = [f for f in controls if parse_key(f)[:2] == ["queue", vhost]]
        for key, fields in (
            (keys.permissions, in_permissions),
            (keys.policies, in_policies),
            (keys.controls, in_controls),
        ):
            if fields:
                tx.write("HDEL", key, *fields)
        return [
            *(loads(Permission, permissions[f]) for f in in_permissions),
            *(loads(Policy, policies[f]) for f in in_policies),
            *(loads(ConsumptionControl, controls[f]) for f in in_controls),
        ]


def _as(kind: ChangeKind, model: type[BaseModel]) -> Callable[[str], Change]:
    return lambda text: change(kind, loads(model, text))
