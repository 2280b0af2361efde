"""The controller's Redis keys. They share the metadata store's prefix (``mqgw:``, as
meta/redis_keys.py) and its encoding of names (a group name percent-encoded inside a key),
and never overlap its keys. The broker registry (``<prefix>brokers`` and the broker leases)
is meta's, read here for liveness only.
"""

from __future__ import annotations

from urllib.parse import quote

from meta.redis_keys import DEFAULT_PREFIX, RedisKeys


class ControllerKeys:
    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        self.prefix = prefix
        self.lease = prefix + "controller:lease"  # string "<holder> <token>", PX lease_ms
        self.tokens = prefix + "controller:tokens"  # INCR counter: the lease's fencing tokens
        self.groups = prefix + "groups"  # set: groups that have a record or a heartbeat
        self.changes = prefix + "group-changes"  # stream: what the controller decided
        meta = RedisKeys(prefix)
        self.registry = meta.brokers  # hash ["group","id"] -> BrokerInfo (meta's)
        self.registry_lease_prefix = prefix + "broker:"  # + quote(group) + ":" + id (meta's)
        assert meta.broker_lease("g", "i") == self.registry_lease_prefix + "g:i"

    def record(self, group: str) -> str:  # hash: GroupRecord (meta/groups/records.py)
        return self.prefix + "group:" + quote(group, safe="")

    def members(self, group: str) -> str:  # set: ids of the group's brokers that heartbeat
        return self.prefix + "group-members:" + quote(group, safe="")

    def replica_prefix(self, group: str) -> str:
        return self.prefix + "replica:" + quote(group, safe="") + ":"

    def replica(self, group: str, broker_id: str) -> str:  # hash: the heartbeat record
        return self.replica_prefix(group) + broker_id

    def switchover(self, group: str) -> str:  # string JSON {"id", "target"}, 30 s TTL
        return self.prefix + "switchover:" + quote(group, safe="")
