"""The store port over Apache RocketMQ 5 (docs/rocketmq.md): ``connect_rocketmq_store``
opens one from a ``rocketmq://NAMESRV[;NAMESRV...][/NAMESPACE]`` URL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

from storage.clients.link import BrokerUnavailable
from storage.rocketmq.client import RocketMQClient
from storage.rocketmq.connection import open_pool
from storage.rocketmq.naming import Names
from storage.rocketmq.store import RocketMQStore

__all__ = ["RocketMQStore", "connect_rocketmq_store", "parse_rocketmq_url"]


def parse_rocketmq_url(url: str) -> tuple[list[str], Names]:
    """Name server addresses and the namespace of a ``rocketmq://`` URL (ValueError with
    what is wrong)."""
    parts = urlsplit(url)
    if parts.scheme != "rocketmq":
        raise ValueError(f"{url!r}: a RocketMQ store URL starts with rocketmq://")
    servers = [s.strip() for s in parts.netloc.split(";") if s.strip()]
    if not servers:
        raise ValueError(f"{url!r}: name at least one name server, rocketmq://host:port")
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{url!r}: name server {server!r} is not host:port")
    namespace = parts.path.strip("/") or "mqgw"
    return servers, Names(namespace)


@asynccontextmanager
async def connect_rocketmq_store(url: str, max_record_bytes: int) -> AsyncIterator[RocketMQStore]:
    """A store over the RocketMQ cluster of ``url``; BrokerUnavailable when no name server
    answers, or no broker group has a master."""
    servers, names = parse_rocketmq_url(url)
    async with open_pool() as pool:
        client = RocketMQClient(pool, servers)
        masters = await client.masters()
        if not masters:
            raise BrokerUnavailable(f"rocketmq {';'.join(servers)}: no broker has registered")
        yield RocketMQStore(client, names, max_record_bytes)
