"""What `mqgw cluster status` reports: per process, whether it runs and whether it serves.

- redis: its pid runs and it answers PING;
- broker: its pid runs and its registration in Redis is there, with the address we gave it,
  and its lease is alive (what gateways go by to find it); a replicated one also has a
  heartbeat record Redis stored less than 2 s ago (by Redis's clock);
- controller: its pid runs (whether it leads is shown, not judged: one leads at a time);
- gateway: its pid runs and /api/health answers "ok";
- watcher: its pid runs.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from localcluster import probes
from localcluster.launch import is_alive
from localcluster.layout import (
    BrokerMember,
    Cluster,
    ControllerMember,
    GatewayMember,
    Member,
    RedisMember,
    WatcherMember,
)
from localcluster.roles import FRESH_HEARTBEAT_MS, Observed
from meta.cluster import BrokerInfo
from meta.errors import MetadataUnavailable
from meta.redis_store import RedisMetadataStore

Registrations = dict[str, BrokerInfo] | str  # by "group/id", or why they could not be read

_REDIS_TIMEOUT_S = 2.0


@dataclass
class Health:
    member: Member
    alive: bool
    healthy: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        member = self.member
        body = {
            "name": member.name,
            "role": member.role,
            "pid": member.pid if self.alive else None,
            "alive": self.alive,
            "healthy": self.healthy,
            "health": self.detail,
            "endpoint": member.endpoint,
            "ports": member.ports,
        }
        if isinstance(member, BrokerMember):
            body |= {"group": member.group, "epoch": member.epoch, "in_sync": member.in_sync}
        if isinstance(member, ControllerMember):
            body["leader"] = member.leader
        return body


def check(cluster: Cluster, observed: Observed | None = None) -> list[Health]:
    """The health of every process, in start order. ``observed``: the controller's keys as
    read by ``roles.refresh`` (None: Redis did not answer, or nothing is replicated)."""
    redis_up = is_alive(cluster.redis) and probes.redis_ping(cluster.redis.port)
    registrations = _registrations(cluster.meta_url) if redis_up else "Redis is down"
    return [_one(member, redis_up, registrations, observed) for member in cluster.members()]


def _one(
    member: Member, redis_up: bool, registrations: Registrations, observed: Observed | None
) -> Health:
    if not is_alive(member):
        return Health(member, alive=False, healthy=False, detail="not running")
    if isinstance(member, RedisMember):
        return Health(member, True, redis_up, "PONG" if redis_up else "no answer to PING")
    if isinstance(member, BrokerMember):
        registered = _broker(member, registrations)
        if not member.replicated or not registered.healthy:
            return registered
        return _replica(member, observed)
    if isinstance(member, ControllerMember):
        return Health(member, True, True, "leads" if member.leader else "standby")
    if isinstance(member, WatcherMember):
        return Health(member, True, True, f"keeps {member.endpoint} current")
    if isinstance(member, GatewayMember):
        body = probes.gateway_health(member.admin_url)
        if body is None:
            return Health(member, True, False, f"no answer from {member.admin_url}/api/health")
        return Health(
            member, True, True, f"/api/health answers, {body.get('connections', '?')} connections"
        )
    raise TypeError(f"unknown member kind {type(member).__name__}")


def _broker(member: BrokerMember, registrations: Registrations) -> Health:
    if isinstance(registrations, str):
        return Health(member, True, False, f"registration unknown: {registrations}")
    info = registrations.get(f"{member.group}/{member.broker_id}")
    if info is None:
        return Health(member, True, False, "not registered in Redis")
    if info.address != member.address:
        return Health(member, True, False, f"registered as {info.address}, not {member.address}")
    if not info.alive:
        return Health(member, True, False, "registered, but its lease lapsed")
    return Health(member, True, True, "registered, lease alive")


def _replica(member: BrokerMember, observed: Observed | None) -> Health:
    if observed is None:
        return Health(member, True, False, "registered; heartbeat unknown (Redis did not answer)")
    age_ms = observed.heartbeat_age_ms(member)
    if age_ms is None:
        return Health(member, True, False, "registered, but no heartbeat to the controller yet")
    sync = "in sync" if member.in_sync else "not in sync"
    if age_ms > FRESH_HEARTBEAT_MS:
        return Health(member, True, False, f"{sync}, last heartbeat {age_ms} ms ago (stale)")
    return Health(member, True, True, f"{sync}, heartbeat {age_ms} ms ago, registered")


def _registrations(url: str) -> Registrations:
    async def read() -> dict[str, BrokerInfo]:
        store = RedisMetadataStore(url, default_user=False, unavailable_timeout_s=_REDIS_TIMEOUT_S)
        try:
            return {f"{b.group}/{b.broker_id}": b for b in await store.list_brokers()}
        finally:
            await store.close()

    try:
        return asyncio.run(read())
    except MetadataUnavailable as error:
        return str(error)
