"""The local store's calls for what is not topology: users, permissions, policies, vhost
limits, gray release rules and consumption controls.

Each mutation changes ``LocalRecords`` in memory, publishes its change to the in-memory feed
and commits the file (meta.local_base), as the topology calls in meta.local_store do; reads
are plain lookups. The Redis store's counterpart is meta.redis_records.
"""

from __future__ import annotations

from meta.change_feed import change
from meta.errors import vhost_not_found
from meta.local_base import LocalStoreBase
from meta.models import ConsumptionControl, GrayRule, Permission, Policy, User, VHostLimits


class LocalRecordsMixin(LocalStoreBase):
    """Users, permissions, policies, vhost limits, gray rules and controls of the local store."""

    # --- users and permissions ---

    async def list_users(self) -> list[User]:
        return list(self._records.users.values())

    async def get_user(self, name: str) -> User | None:
        return self._records.users.get(name)

    async def put_user(self, user: User) -> None:
        self._records.users[user.name] = user
        self._feed.publish([change("user.put", user)])
        await self._commit()

    async def delete_user(self, name: str) -> bool:
        user = self._records.users.pop(name, None)
        if user is None:
            return False
        permissions = self._records.permissions
        dropped = [permissions.pop(k) for k in [k for k in permissions if k[0] == name]]
        self._feed.publish(
            [*(change("permission.cleared", p) for p in dropped), change("user.deleted", user)]
        )
        await self._commit()
        return True

    async def authenticate(self, name: str, password: str) -> User | None:
        user = self._records.users.get(name)
        return user if user is not None and user.accepts(password) else None

    async def set_permission(self, permission: Permission) -> None:
        if permission.vhost not in self._state.vhosts:
            raise vhost_not_found(permission.vhost)
        self._records.permissions[(permission.user, permission.vhost)] = permission
        self._feed.publish([change("permission.set", permission)])
        await self._commit()

    async def clear_permission(self, user: str, vhost: str) -> None:
        cleared = self._records.permissions.pop((user, vhost), None)
        if cleared is not None:
            self._feed.publish([change("permission.cleared", cleared)])
            await self._commit()

    async def get_permission(self, user: str, vhost: str) -> Permission | None:
        return self._records.permissions.get((user, vhost))

    async def list_permissions(self, vhost: str | None = None) -> list[Permission]:
        permissions = self._records.permissions.values()
        return [p for p in permissions if vhost is None or p.vhost == vhost]

    # --- policies ---

    async def put_policy(self, policy: Policy) -> None:
        if policy.vhost not in self._state.vhosts:
            raise vhost_not_found(policy.vhost)
        self._records.policies[(policy.vhost, policy.name)] = policy
        self._feed.publish([change("policy.put", policy)])
        await self._commit()

    async def delete_policy(self, vhost: str, name: str) -> bool:
        policy = self._records.policies.pop((vhost, name), None)
        if policy is None:
            return False
        self._feed.publish([change("policy.deleted", policy)])
        await self._commit()
        return True

    async def list_policies(self, vhost: str | None = None) -> list[Policy]:
        policies = self._records.policies.values()
        return [p for p in policies if vhost is None or p.vhost == vhost]

    # --- vhost limits ---

    async def set_vhost_limits(self, limits: VHostLimits) -> None:
        if limits.vhost not in self._state.vhosts:
            raise vhost_not_found(limits.vhost)
        self._records.vhost_limits[limits.vhost] = limits
        self._feed.publish([change("vhost_limits.set", limits)])
        await self._commit()

    async def get_vhost_limits(self, vhost: str) -> VHostLimits | None:
        return self._records.vhost_limits.get(vhost)

    async def list_vhost_limits(self) -> list[VHostLimits]:
        return sorted(self._records.vhost_limits.values(), key=lambda v: v.vhost)

    # --- gray release rules ---

    async def set_gray_rule(self, rule: GrayRule) -> None:
        self._records.gray_rules[rule.name] = rule
        self._feed.publish([change("gray_rule.set", rule)])
        await self._commit()

    async def delete_gray_rule(self, name: str) -> bool:
        rule = self._records.gray_rules.pop(name, None)
        if rule is None:
            return False
        self._feed.publish([change("gray_rule.deleted", rule)])
        await self._commit()
        return True

    async def get_gray_rule(self, name: str) -> GrayRule | None:
        return self._records.gray_rules.get(name)

    async def list_gray_rules(self) -> list[GrayRule]:
        return sorted(self._records.gray_rules.values(), key=lambda r: r.name)

    # --- consumption controls ---

    async def put_control(self, control: ConsumptionControl) -> None:
        self._records.controls[control.key] = control
        self._feed.publish([change("control.put", control)])
        await self._commit()

    async def delete_control(self, scope: str, vhost: str, name: str) -> bool:
        control = self._records.controls.pop((scope, vhost, name), None)
        if control is None:
            return False
        self._feed.publish([change("control.deleted", control)])
        await self._commit()
        return True

    async def list_controls(self) -> list[ConsumptionControl]:
        return list(self._records.controls.values())
