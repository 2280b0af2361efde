"""The store port over Apache RocketMQ 5 (docs/rocketmq.md): ``connect_rocketmq_store``
opens one from a ``rocketmq://NAMESRV[;NAMESRV...][/NAMESPACE]`` URL."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

from storage.clients.link import BrokerUnavailable
from storage.rocketmq.client import RocketMQClient
from storage.rocketmq.connection import open_pool
from storage.rocketmq.naming import Names
from storage.rocketmq.store import RocketMQStore

__all__ = ["RocketMQStore", "connect_rocketmq_store", "parse_rocketmq_url"]

log = logging.getLogger("mqgw.storage")
# RocketMQ's own default when a broker does not say (BrokerConfig/MessageStoreConfig).
DEFAULT_MAX_MESSAGE_SIZE = 4 << 20


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
        limit = await _largest_message(client, list(masters.values()), max_record_bytes)
        yield RocketMQStore(client, names, limit)


async def _largest_message(client: RocketMQClient, brokers: list[str], configured: int) -> int:
    """The gateway's limit, lowered to the smallest ``maxMessageSize`` of the brokers: a
    larger message is refused here, never sent. A broker refuses it too, but only after
    taking the whole request into its direct memory: a few such sends of 100 MiB at once
    exhaust it and the broker stops accepting connections for seconds at a time."""
    limit = configured
    for broker in brokers:
        config = await client.broker_config(broker)
        size = int(config.get("maxMessageSize") or DEFAULT_MAX_MESSAGE_SIZE)
        if size < limit:
            log.info("rocketmq %s: maxMessageSize %d: larger messages are nacked", broker, size)
            limit = size
    return limit
