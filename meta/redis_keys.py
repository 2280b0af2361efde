"""The Redis key layout of the metadata store (docs/metadata.md draws it).

Every key starts with the store's prefix (default ``mqgw:``). Per-vhost keys start with
``<prefix>v:<vhost>:`` where the vhost name is percent-encoded, so a ':' in a vhost name
cannot make two (vhost, name) pairs share a key; the entity name is always the last part and
kept as is. Each exchange and queue is a key of its own rather than a field of a hash
because WATCH works on whole keys: a transaction watches exactly the entities it read, and
declarations of different queues never conflict.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import quote

from meta.models import BindingDef

DEFAULT_PREFIX = "mqgw:"
_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def binding_field(binding: BindingDef) -> str:
    """A binding's field in the out/in hashes: a digest of its identity (source, destination,
    key and arguments as RabbitMQ compares them), stable across processes and versions."""
    return hashlib.blake2b(repr(binding.identity).encode(), digest_size=16).hexdigest()


class RedisKeys:
    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        self.prefix = prefix
        # Whole-cluster keys.
        self.vhosts = prefix + "vhosts"  # hash: vhost -> VHost
        self.users = prefix + "users"  # hash: user -> User
        self.permissions = prefix + "permissions"  # hash: ["user","vhost"] -> Permission
        self.policies = prefix + "policies"  # hash: ["vhost","name"] -> Policy
        self.controls = prefix + "controls"  # hash: ["scope","vhost","name"] -> control
        self.vhost_limits = prefix + "vhost-limits"  # hash: vhost -> VHostLimits
        self.queue_ids = prefix + "queue-ids"  # INCR counter: the last queue id handed out
        self.changes = prefix + "changes"  # stream: the change feed
        self.bootstrapped = prefix + "bootstrapped"  # set once: "/" and guest were created
        self.gateways = prefix + "gateways"  # set: registered gateway ids (leased or lapsed)
        self.brokers = prefix + "brokers"  # hash: ["group","id"] -> BrokerInfo
        self.placement_load = prefix + "placement-load"  # hash: group -> partitions placed
        self.retired_groups = prefix + "retired-groups"  # set: groups removed from the cluster
        # hash: gateway -> "<Redis ms> <report>" (meta/throttle_shares.py)
        self.throttle_demand = prefix + "throttle-demand"
        self.move_job = prefix + "move-job"  # string: the cluster's group move job (JSON)
        self.move_job_lease = prefix + "move-job-lease"  # string with a TTL: the gateway running it

    def written(self, token: str) -> str:
        """string with a TTL: one metadata transaction's mark (meta/redis_replicated.py)"""
        return self.prefix + "written:" + token

    def vhost_part(self, vhost: str) -> str:
        return f"{self.prefix}v:{quote(vhost, safe='')}:"

    def exchange(self, vhost: str, name: str) -> str:  # string: ExchangeDef
        return self.vhost_part(vhost) + "x:" + name

    def exchange_index(self, vhost: str) -> str:  # set of exchange names
        return self.vhost_part(vhost) + "xs"

    def queue(self, vhost: str, name: str) -> str:  # string: QueueDef
        return self.vhost_part(vhost) + "q:" + name

    def queue_index(self, vhost: str) -> str:  # set of queue names
        return self.vhost_part(vhost) + "qs"

    def outgoing(self, vhost: str, source: str) -> str:  # hash: binding_field -> BindingDef
        return self.vhost_part(vhost) + "out:" + source

    def incoming(self, vhost: str, destination_type: str, destination: str) -> str:  # same
        return self.vhost_part(vhost) + "in:" + destination_type + ":" + destination

    def route(self, vhost: str, queue: str) -> str:  # string: JSON list of groups
        return self.vhost_part(vhost) + "route:" + queue

    def consumer_claims(self, vhost: str, queue: str) -> str:  # hash: gateway -> "<ms> x|c"
        return self.vhost_part(vhost) + "consumers:" + queue

    def connections(self, vhost: str) -> str:  # set: "<gateway>/<n>" connections open in it
        return self.vhost_part(vhost) + "conns"

    def owner(self, connection_id: str) -> str:  # set: ["vhost","queue"] it owns exclusively
        return self.prefix + "owner:" + connection_id

    def owner_pattern(self, gateway_id: str) -> str:
        """SCAN pattern of the owner sets of every "<gateway_id>/<n>" connection."""
        return _GLOB_SPECIAL.sub(r"\\\1", self.owner(gateway_id)) + "/*"

    def gateway_lease(self, gateway_id: str) -> str:  # string with a TTL
        return self.prefix + "gateway:" + gateway_id

    def delivery_lease(self, name: str) -> str:  # string "<owner> <token>" with a TTL
        return self.prefix + "lease:" + name

    def lease_tokens(self) -> str:  # INCR counter: fencing tokens of delivery leases
        return self.prefix + "lease-tokens"

    def lease_handed(self, name: str) -> str:  # string "<token> <mark>|-" with a TTL
        return self.prefix + "lease-handed:" + name

    def hand_over_requests(self, gateway_id: str) -> str:  # list: requests to that gateway
        return self.prefix + "handover:" + gateway_id

    def hand_over_answer(self, request_id: str) -> str:  # list: the one answer to a request
        return self.prefix + "handover-answer:" + request_id

    def view(self, gateway_id: str) -> str:  # string with a TTL: its objects (JSON)
        return self.prefix + "view:" + gateway_id

    def view_requests(self, gateway_id: str) -> str:  # list: actions asked of that gateway
        return self.prefix + "view-requests:" + gateway_id

    def view_answer(self, request_id: str) -> str:  # list: the one answer to a view request
        return self.prefix + "view-answer:" + request_id

    def reply_inbox(self, tag: str) -> str:  # list: relayed direct replies to that gateway
        return self.prefix + "replies:" + tag

    def reply_live(self, tag: str) -> str:  # string with a TTL: that gateway reads its inbox
        return self.prefix + "replies-live:" + tag

    def broker_lease(self, group: str, broker_id: str) -> str:  # string with a TTL
        return f"{self.prefix}broker:{quote(group, safe='')}:{broker_id}"
