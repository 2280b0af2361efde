"""Who is master of each replicated group, at which epoch, and which controller leads: read
from Redis in one round trip and written into the cluster's members.

The sources are the controller's (docs/controller.md): the group record ``mqgw:group:<g>``
(master, epoch, in-sync set), each broker's heartbeat record ``mqgw:replica:<g>:<id>`` (the
role it acts as, when Redis stored it) and the lease ``mqgw:controller:lease`` (``"<name>/
<random> <token>"``). A synchronous client: the watcher and the commands are plain loops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from redis import exceptions as redis_errors

from localcluster.layout import BrokerMember, Cluster
from meta.groups.keys import ControllerKeys
from meta.groups.records import GroupRecord, ReplicaReport, parse_heartbeat, parse_record
from meta.redis_url import sync_client

FRESH_HEARTBEAT_MS = 2_000  # a heartbeat older than this (by Redis's clock) is a silent broker
REDIS_DOWN = (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError)


@dataclass(frozen=True)
class Observed:
    """One read of the controller's keys for a cluster."""

    now_ms: int  # Redis's clock, the one heartbeat times are stamped with
    leader: str  # the name of the controller holding the lease; "" when none does
    token: int  # the lease's fencing token (0: none)
    records: dict[str, GroupRecord]  # by group
    heartbeats: dict[tuple[str, str], ReplicaReport]  # by (group, broker id)

    def heartbeat_age_ms(self, broker: BrokerMember) -> int | None:
        """How long ago Redis stored ``broker``'s last heartbeat; None if it never did."""
        beat = self.heartbeats.get((broker.group, broker.broker_id))
        return None if beat is None else max(self.now_ms - beat.at_ms, 0)

    def record(self, group: str) -> GroupRecord:
        return self.records.get(group) or GroupRecord(group)

    def role(self, broker: BrokerMember) -> tuple[str, int, bool]:
        """(role, epoch, in sync) of a replicated broker. The record names the master (even a
        dead one, until the controller elects another); a slave is one whose fresh heartbeat
        says it follows at the record's epoch; anything else (stopped, stale, catching up to
        a new epoch) is "none", at the highest epoch it reported."""
        record = self.record(broker.group)
        in_sync = broker.broker_id in record.in_sync
        if record.master and record.master == broker.broker_id:
            return "master", record.epoch, in_sync
        beat = self.heartbeats.get((broker.group, broker.broker_id))
        if beat is None:
            return "none", 0, in_sync
        age = self.heartbeat_age_ms(broker)
        fresh = age is not None and age <= FRESH_HEARTBEAT_MS
        if fresh and beat.role == "slave" and beat.epoch == record.epoch:
            return "slave", beat.epoch, in_sync
        return "none", beat.epoch, in_sync


def connect(url: str) -> redis.Redis:
    # Short timeouts: a status or a watcher round must not hang on a Redis that is gone.
    return sync_client(url, connect_timeout_s=0.5, socket_timeout_s=1.0)


def observe(client: redis.Redis, cluster: Cluster, keys: ControllerKeys | None = None) -> Observed:
    """Read the lease, the group records and the heartbeats of ``cluster``'s replicated
    brokers in one pipeline. Raises one of REDIS_DOWN when Redis does not answer."""
    keys = keys or ControllerKeys()
    groups = cluster.replicated_groups()
    brokers = [b for b in cluster.brokers if b.replicated]
    pipe = client.pipeline(transaction=False)
    pipe.time()
    pipe.get(keys.lease)
    for group in groups:
        pipe.hgetall(keys.record(group))
    for broker in brokers:
        pipe.hgetall(keys.replica(broker.group, broker.broker_id))
    replies: list[Any] = pipe.execute()
    seconds, micros = replies[0]
    leader, token = _lease(replies[1])
    records = {
        group: parse_record(group, fields)
        for group, fields in zip(groups, replies[2 : 2 + len(groups)], strict=True)
        if fields
    }
    heartbeats = {}
    for broker, fields in zip(brokers, replies[2 + len(groups) :], strict=True):
        if fields:
            report, _lag = parse_heartbeat(broker.group, broker.broker_id, fields)
            heartbeats[(broker.group, broker.broker_id)] = report
    return Observed(int(seconds) * 1000 + int(micros) // 1000, leader, token, records, heartbeats)


def _lease(value: str | None) -> tuple[str, int]:
    """The lease's holder name and token: the holder is "<name>/<random>", new per start."""
    if not value:
        return "", 0
    holder, _, token = value.partition(" ")
    name = holder.rpartition("/")[0] or holder
    return name, int(token) if token.isdigit() else 0


def apply(cluster: Cluster, observed: Observed) -> list[str]:
    """Set roles, epochs, in-sync flags and the leader from ``observed``; what changed, one
    line each (empty: nothing did)."""
    changes = []
    for broker in cluster.brokers:
        if not broker.replicated:
            continue  # a lone broker is its group's master, with no controller to ask
        role, epoch, in_sync = observed.role(broker)
        was = (broker.role, broker.epoch, broker.in_sync)
        if (role, epoch, in_sync) != was:
            changes.append(f"{broker.name}: {_standing(*was)} -> {_standing(role, epoch, in_sync)}")
            broker.role, broker.epoch, broker.in_sync = role, epoch, in_sync
    before = next((c.name for c in cluster.controllers if c.leader), "")
    for controller in cluster.controllers:
        controller.leader = controller.name == observed.leader
    after = next((c.name for c in cluster.controllers if c.leader), "")
    if before != after:
        changes.append(f"controller leader: {before or 'none'} -> {after or 'none'}")
    return changes


def _standing(role: str, epoch: int, in_sync: bool) -> str:
    return f"{role} at epoch {epoch} ({'in sync' if in_sync else 'not in sync'})"


def refresh(cluster: Cluster) -> Observed | None:
    """Read Redis and apply what it says to ``cluster``; None (cluster untouched) if there is
    nothing to read or Redis does not answer."""
    if not cluster.controllers and not cluster.replicated_groups():
        return None
    client = connect(cluster.meta_url)
    try:
        observed = observe(client, cluster)
    except REDIS_DOWN:
        return None
    finally:
        client.close()
    apply(cluster, observed)
    return observed
