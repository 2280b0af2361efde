"""The users a node authenticates against: the configured ones created on first sight (as
RabbitMQ applies ``default_user`` on first boot only), and logins that go on while the
metadata store is away, checked against the users this gateway saw last."""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import Any

import anyio

from gateway.config.settings import GatewaySettings
from gateway.queues.clock import Clock
from meta.errors import MetadataUnavailable
from meta.models import Permission, User, VHost
from meta.password import check_password, hash_password
from meta.store import MetadataStore

log = logging.getLogger("mqgw.node")

META_RETRY_S = 2.0  # after the metadata store was found away, logins skip it this long
LOGIN_META_WAIT_S = 1.0  # a login waits no longer for it (a client's handshake has limits)


class Users:
    def __init__(self, meta: MetadataStore, settings: GatewaySettings, clock: Clock) -> None:
        self.meta = meta
        self.settings = settings
        self.clock = clock
        self.known_users: dict[str, User] = {}  # as last read: logins while Redis is away
        self._meta_down_until = 0.0

    async def apply_configured(self) -> None:
        """Configured vhosts and users, each created only when it does not exist yet (as
        RabbitMQ applies default_user on first boot only): what the API changed since, a
        password or narrowed permissions, stays. Full permissions (RabbitMQ's
        default_permissions) go to a user created now on every configured vhost, and on a
        vhost created now to every configured user (to guest when the file names none)."""
        configured = [user.name for user in self.settings.users]
        created: list[str] = []
        for user in self.settings.users:
            if await self.meta.get_user(user.name) is None:
                tags = tuple(user.tags)
                password_hash = hash_password(user.password)
                await self.meta.put_user(
                    User(name=user.name, password_hash=password_hash, tags=tags)
                )
                created.append(user.name)
        if not configured and await self.meta.get_user("guest") is not None:
            configured = ["guest"]
        for name in self.settings.vhosts:
            new = await self.meta.get_vhost(name) is None
            await self.meta.add_vhost(VHost(name=name))
            for user_name in configured if new else created:
                await self.meta.set_permission(Permission(user=user_name, vhost=name))
        users = await self.meta.list_users()
        if self.settings.admin_port and not any(user.is_administrator for user in users):
            # Controls, users and permissions need the tag: nobody would get past 403. A
            # configured user that exists is not changed, so the way in is a new one.
            log.warning(
                "no user has the administrator tag: the admin API refuses every control and "
                "every change of users (403); add a [[users]] entry with a new name and tags = "
                '["administrator"] to the configuration and restart'
            )

    async def authenticate(self, username: str, password: bytes) -> User | None:
        """Checked by the metadata store; while it is unreachable (Redis down) against the
        users this gateway saw last, so that clients can still connect to what exists."""
        try:
            text = password.decode()
        except UnicodeDecodeError:
            return None
        found, user = await self._ask_meta(self.meta.authenticate(username, text))
        if found:
            self._remember(username, user)
            return user
        known = self.known_users.get(username)
        if known is None or not check_password(text, known.password_hash, known.hashing_algorithm):
            return None
        return known

    def known(self, name: str) -> User | None:
        """The user as this gateway last read it (refreshed at every login)."""
        return self.known_users.get(name)

    async def get(self, name: str) -> User | None:
        found, user = await self._ask_meta(self.meta.get_user(name))
        if found:
            self._remember(name, user)
            return user
        return self.known_users.get(name)

    async def _ask_meta(self, call: Coroutine[Any, Any, User | None]) -> tuple[bool, User | None]:
        """(True, answer) from the metadata store, or (False, None) when it is away or slow.
        After one call found it away, the next few seconds' logins do not wait for it."""
        if self.clock.monotonic() < self._meta_down_until:
            call.close()
            return False, None
        try:
            with anyio.fail_after(LOGIN_META_WAIT_S):
                return True, await call
        except (MetadataUnavailable, TimeoutError) as error:
            self._meta_down_until = self.clock.monotonic() + META_RETRY_S
            log.warning("logins use the users known here: metadata store: %s", error or "slow")
            return False, None

    async def refresh(self) -> None:
        self.known_users = {user.name: user for user in await self.meta.list_users()}

    def _remember(self, name: str, user: User | None) -> None:
        if user is None:
            self.known_users.pop(name, None)
        else:
            self.known_users[name] = user
