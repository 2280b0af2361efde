"""Who may call the admin API: HTTP basic authentication against the node's users, and
RabbitMQ's management tags.

- no or bad credentials: 401 with ``WWW-Authenticate`` (a browser asks for a password);
- a loopback-only user (``guest``) from another address: 401, as in RabbitMQ;
- a user without a tag that allows the call: 403.

Tags, as RabbitMQ's management plugin reads them: ``management`` sees the vhosts it has
permissions in; ``policymaker`` also writes policies there; ``monitoring`` reads everything;
``administrator`` does everything. Each route states the tag it needs with ``Depends(...)``.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from fastapi import HTTPException, Request

from meta.models import User

if TYPE_CHECKING:
    from gateway.node import Node

MANAGEMENT = "management"
POLICYMAKER = "policymaker"
MONITORING = "monitoring"
ADMINISTRATOR = "administrator"

# What each tag grants, beyond itself (RabbitMQ: administrator > monitoring, policymaker >
# management).
_IMPLIED: dict[str, frozenset[str]] = {
    MANAGEMENT: frozenset({MANAGEMENT}),
    POLICYMAKER: frozenset({MANAGEMENT, POLICYMAKER}),
    MONITORING: frozenset({MANAGEMENT, MONITORING}),
    ADMINISTRATOR: frozenset({MANAGEMENT, POLICYMAKER, MONITORING, ADMINISTRATOR}),
}
REALM = 'Basic realm="mqgw management"'


def granted(user: User) -> frozenset[str]:
    """Every management tag ``user`` holds, directly or through a wider one."""
    result: set[str] = set()
    for tag in user.tags:
        result |= _IMPLIED.get(tag, frozenset())
    return frozenset(result)


def has_tag(user: User, tag: str) -> bool:
    return tag in granted(user)


def reads_everything(user: User) -> bool:
    """monitoring and administrator see every vhost; management users only their own."""
    return has_tag(user, MONITORING)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def _unauthorized(reason: str) -> HTTPException:
    return HTTPException(401, reason, headers={"WWW-Authenticate": REALM})


def basic_credentials(header: str | None) -> tuple[str, str] | None:
    """(user, password) from an ``Authorization: Basic ...`` header, None if absent/bad."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    name, sep, password = decoded.partition(":")
    return (name, password) if sep else None


def requires(tag: str, node: Node) -> Callable[[Request], Awaitable[User]]:
    """A FastAPI dependency: the authenticated user, who must hold ``tag``."""

    async def dependency(request: Request) -> User:
        user = await authenticate(request, node)
        if not has_tag(user, tag):
            raise HTTPException(403, f"user '{user.name}' has no '{tag}' tag (needed here)")
        return user

    return dependency


async def authenticate(request: Request, node: Node) -> User:
    credentials = basic_credentials(request.headers.get("authorization"))
    if credentials is None:
        raise _unauthorized("authentication required")
    name, password = credentials
    # The node's users: while the metadata store is away, the users it saw last.
    user = await node.users.authenticate(name, password.encode())
    if user is None:
        raise _unauthorized("invalid credentials")
    client = request.client.host if request.client else ""
    if name in node.settings.loopback_users and not is_loopback(client):
        raise _unauthorized(f"user '{name}' can only log in via localhost")
    if not granted(user):
        raise HTTPException(403, f"user '{name}' is not a management user (no management tag)")
    return user
