"""Redis clients from one URL form, a single Redis or one found through Redis Sentinel.

    redis://[USER:PASS@]HOST:PORT/DB
    redis+sentinel://[USER:PASS@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]

Every process that talks to the cluster's Redis (gateways, controllers, brokers, the CLI)
makes its client here, so all of them follow a Sentinel failover the same way: each new
connection asks the sentinels for the current master, and a connection to a master that
became a replica is dropped (redis-py's SentinelManagedConnection). The credentials are the
Redis master's; sentinels that want a password of their own take ``?sentinel_password=``.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass
from typing import Any

import redis
import redis.sentinel
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

SENTINEL_SCHEME = "redis+sentinel"
DEFAULT_SENTINEL_PORT = 26379


@dataclass(frozen=True)
class SentinelTarget:
    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None
    password: str | None
    sentinel_password: str | None

    def describe(self) -> str:
        hosts = ",".join(f"{host}:{port}" for host, port in self.sentinels)
        return f"{SENTINEL_SCHEME}://{hosts}/{self.service}/{self.db}"


def parse_sentinel_url(url: str) -> SentinelTarget | None:
    """The Sentinel target ``url`` names; None for any other scheme. ValueError when it is
    a Sentinel URL that says too little (no host, no service name, a bad port or DB)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        return None
    credentials, _, hosts = parts.netloc.rpartition("@")
    username, password = None, None
    if credentials:
        user, has_password, secret = credentials.partition(":")
        username = urllib.parse.unquote(user) or None
        password = urllib.parse.unquote(secret) if has_password else None
    sentinels = tuple(_host_port(item) for item in hosts.split(",") if item)
    if not sentinels:
        raise ValueError(f"{SENTINEL_SCHEME} URL without a sentinel host: {url!r}")
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise ValueError(f"{SENTINEL_SCHEME} URL wants /SERVICE or /SERVICE/DB: {url!r}")
    try:
        db = int(path[1]) if len(path) == 2 else 0
    except ValueError:
        raise ValueError(f"{SENTINEL_SCHEME} URL with a DB that is not a number: {url!r}") from None
    query = urllib.parse.parse_qs(parts.query)
    sentinel_password = query.get("sentinel_password", [None])[0]
    return SentinelTarget(sentinels, path[0], db, username, password, sentinel_password)


def _host_port(item: str) -> tuple[str, int]:
    host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
    try:
        return (host.strip("[]"), int(port) if port else DEFAULT_SENTINEL_PORT)
    except ValueError:
        raise ValueError(f"sentinel address with a bad port: {item!r}") from None


def describe(url: str) -> str:
    """Where ``url`` leads, without credentials (for logs and errors)."""
    target = parse_sentinel_url(url)
    if target is not None:
        return target.describe()
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    host = parts.hostname or "localhost"
    return f"{parts.scheme}://{host}:{parts.port or 6379}{parts.path or '/0'}"


class _BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """A Sentinel-managed pool that queues for a connection when all are in use, as the
    metadata store's pool does for a single Redis (meta/redis_conn.py)."""


def async_client(
    url: str,
    *,
    connect_timeout_s: float,
    socket_timeout_s: float,
    max_connections: int | None = None,
    **options: Any,
) -> Redis:
    """An asyncio client for ``url``. With ``max_connections``, a blocking pool of that
    size; replies decoded, RESP2 (the shapes the stores parse)."""
    common: dict[str, Any] = {
        "decode_responses": True,
        "protocol": 2,
        "socket_connect_timeout": connect_timeout_s,
        "socket_timeout": socket_timeout_s,
        **options,
    }
    target = parse_sentinel_url(url)
    if target is None:
        if max_connections is None:
            client: Redis = Redis.from_url(url, **common)
            return client
        pool = BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=None, **common
        )
        return Redis.from_pool(pool)
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(target.sentinels),
        sentinel_kwargs=_sentinel_kwargs(target, connect_timeout_s, socket_timeout_s),
    )
    pooled: dict[str, Any] = {}
    if max_connections is not None:
        pooled = {"max_connections": max_connections, "timeout": None}
    master: Redis = sentinel.master_for(
        target.service,
        connection_pool_class=_BlockingSentinelPool if pooled else SentinelConnectionPool,
        db=target.db,
        username=target.username,
        password=target.password,
        **pooled,
        **common,
    )
    return master


def sync_client(url: str, *, connect_timeout_s: float, socket_timeout_s: float) -> redis.Redis:
    """A blocking client for ``url`` (the local cluster's watchers and status)."""
    common: dict[str, Any] = {
        "decode_responses": True,
        "socket_connect_timeout": connect_timeout_s,
        "socket_timeout": socket_timeout_s,
    }
    target = parse_sentinel_url(url)
    if target is None:
        client: redis.Redis = redis.Redis.from_url(url, **common)
        return client
    sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        list(target.sentinels),
        sentinel_kwargs=_sentinel_kwargs(target, connect_timeout_s, socket_timeout_s),
    )
    master: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        target.service,
        db=target.db,
        username=target.username,
        password=target.password,
        **common,
    )
    return master


def _sentinel_kwargs(
    target: SentinelTarget, connect_timeout_s: float, socket_timeout_s: float
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "socket_connect_timeout": connect_timeout_s,
        "socket_timeout": socket_timeout_s,
    }
    if target.sentinel_password is not None:
        kwargs["password"] = target.sentinel_password
    return kwargs
