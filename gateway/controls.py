"""Consumption and publish controls: an operator's stop/start and rate limits, by scope
(vivo's design).

Scopes, widest first: global, node, vhost, client (connection_name or source address, now
and later), connection (one open connection), queue. For stop/start the narrowest control
that sets a state wins; every rate limit that applies binds (the tightest one does).

How they act on deliveries, inside the push scheduler and basic.get:
- a queue whose own control says stopped is paused (the scheduler skips it);
- a connection's state and limits come from the global, node, vhost, client and connection
  scopes: ``session.stopped`` and ``session.limits`` are read by ``Consumer.has_credit``, so
  a stopped connection's consumers simply have no credit until it starts again, while
  unacked deliveries stay with them and acks keep working; a queue whose own control says
  running overrides a wider stop (``queue.control_running``);
- rate limits are token buckets shared by everything in the scope.

Publish limits (``publish_rate_msgs``, ``publish_rate_bytes``; scopes global, node, vhost,
client, connection) are ``session.publish_limits``: the session reads a throttled
publisher's socket more slowly (back-pressure, its state is "flow"), nothing is refused.

In a cluster the rates at the global, vhost, client and queue scopes are totals over every
gateway: this gateway's buckets hold its share, which gateway/cluster/shares.py re-divides
by demand a few times a second (``shared_buckets``, ``set_share``). Node and connection
scopes live on one gateway and are never divided.

Controls live in the metadata store (they survive restarts). Changes apply synchronously in
the event loop, so no delivery starts after the admin call that made them returns.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gateway.features.broadcast import connection_name
from gateway.ports import ConnectionPort, ControlledNode
from gateway.queues.rate_limit import RATE_FIELDS, ControlBuckets, Limits, TokenBucket
from meta.models import CONTROL_SCOPES, ConsumptionControl, ControlScope

if TYPE_CHECKING:
    from gateway.queues.runtime import QueueRuntime

log = logging.getLogger("mqgw.controls")

Key = tuple[str, str, str]  # (scope, vhost, name)

# Scopes whose rates total over every gateway of a cluster (node and connection scopes name
# one gateway's things).
SHARED_SCOPES = frozenset({"global", "vhost", "client", "queue"})


def key_of(scope: ControlScope, vhost: str = "", name: str = "") -> Key:
    return (scope, vhost, name)


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def client_address(session: ConnectionPort) -> str:
    host = session.peer.rsplit(":", 1)[0]
    return host.strip("[]")


class Controls:
    def __init__(self, node: ControlledNode) -> None:
        self.node = node
        self._controls: dict[Key, ConsumptionControl] = {}
        self._buckets: dict[Key, ControlBuckets] = {}
        # Set while the cluster's shares cannot be divided again (Redis away): why they are
        # kept as they are (gateway/cluster/shares.py).
        self.share_note: str | None = None

    # -- reading --------------------------------------------------------------------------

    def all(self) -> list[ConsumptionControl]:
        order = {scope: i for i, scope in enumerate(CONTROL_SCOPES)}
        return sorted(self._controls.values(), key=lambda c: (order[c.scope], c.vhost, c.name))

    def get(self, key: Key) -> ConsumptionControl | None:
        return self._controls.get(key)

    def _session_chain(self, session: ConnectionPort) -> list[ConsumptionControl]:
        """The controls that apply to a connection, widest first."""
        keys = [key_of("global"), key_of("node", name=self.node.name)]
        if session.vhost_name:
            keys.append(key_of("vhost", session.vhost_name))
        keys.append(key_of("client", name=client_address(session)))
        client = connection_name(session.client_properties)
        if client:  # after the address: a control for the name is the more specific one
            keys.append(key_of("client", name=client))
        keys.append(key_of("connection", name=session.name))
        return [c for c in (self._controls.get(k) for k in keys) if c is not None]

    def _queue_chain(self, vhost: str, queue: str) -> list[ConsumptionControl]:
        """The controls that apply to a queue whatever the consumer's connection."""
        keys = [key_of("global"), key_of("node", name=self.node.name), key_of("vhost", vhost)]
        keys.append(key_of("queue", vhost, queue))
        return [c for c in (self._controls.get(k) for k in keys) if c is not None]

    @staticmethod
    def _summary(chain: Iterable[ConsumptionControl]) -> dict[str, Any]:
        state, state_scope = "running", None
        rates: dict[str, float | None] = dict.fromkeys(RATE_FIELDS)
        for control in chain:  # widest first: a narrower state overrides
            if control.state is not None:
                state, state_scope = control.state, control.scope
            for field in RATE_FIELDS:
                rate = getattr(control, field)
                if rate is not None:
                    rates[field] = min(rates[field] or rate, rate)
        return {"state": state, "state_set_at_scope": state_scope, **rates}

    def effective_for_queue(self, vhost: str, queue: str) -> dict[str, Any]:
        """What holds for every consumer of the queue (connection scopes may add to it)."""
        return self._summary(self._queue_chain(vhost, queue))

    def effective_for_session(self, session: ConnectionPort) -> dict[str, Any]:
        return self._summary(self._session_chain(session))

    # -- changing -------------------------------------------------------------------------

    async def load(self) -> None:
        for control in await self.node.meta.list_controls():
            if control.scope == "connection" and not self.node.clustered:
                # Connections do not outlive the node: their controls went with them. (In a
                # cluster the other gateways' connections live on: theirs stay.)
                await self.node.meta.delete_control(*control.key)
                continue
            self._controls[control.key] = control

    async def reload(self) -> None:
        """Controls changed elsewhere (cluster mode): take the store's set and apply it."""
        controls = {c.key: c for c in await self.node.meta.list_controls()}
        for key in list(self._buckets):
            self._rebucket(key, self._controls.get(key), controls.get(key))
        self._controls = controls
        self.apply()

    async def update(self, key: Key, changes: dict[str, Any], user: str) -> ConsumptionControl:
        """Merge ``changes`` (state, rate_msgs, rate_bytes; None clears one) into the control
        of ``key`` and apply it; a control left with nothing in it is removed."""
        scope, vhost, name = key
        current = self._controls.get(key)
        fields: dict[str, Any] = {"state": current.state if current else None}
        fields.update({f: getattr(current, f) if current else None for f in RATE_FIELDS})
        fields.update(changes)
        control = ConsumptionControl.model_validate(
            {
                "scope": scope,
                "vhost": vhost,
                "name": name,
                **fields,
                "set_by": user,
                "set_at": utc_now_iso(),
            }
        )
        if control.is_empty:
            await self.clear(key)
            return control
        await self.node.meta.put_control(control)
        self._rebucket(key, current, control)
        self._controls[key] = control
        log.info(
            "control %s: %s, deliveries %s msgs/s %s bytes/s, publishes %s msgs/s %s bytes/s"
            " (set by %s)",
            describe(key),
            control.state or "state inherited",
            control.rate_msgs or "unlimited",
            control.rate_bytes or "unlimited",
            control.publish_rate_msgs or "unlimited",
            control.publish_rate_bytes or "unlimited",
            user,
        )
        self.apply()
        return control

    async def clear(self, key: Key) -> bool:
        if self._controls.pop(key, None) is None:
            return False
        self._buckets.pop(key, None)
        await self.node.meta.delete_control(*key)
        log.info("consumption control %s cleared", describe(key))
        self.apply()
        return True

    async def forget_vhost(self, vhost: str) -> None:
        for key in [k for k in self._controls if k[0] in ("queue", "vhost") and k[1] == vhost]:
            await self.clear(key)

    async def session_closed(self, session: ConnectionPort) -> None:
        """A connection control goes with its connection (its name is never seen again)."""
        if key_of("connection", name=session.name) in self._controls:
            await self.clear(key_of("connection", name=session.name))

    # -- applying -------------------------------------------------------------------------

    def apply(self) -> None:
        """Recompute every connection and queue, then wake the queues that may deliver."""
        for session in self.node.sessions:
            self.attach_session(session)
        for queue in self.node.all_queues():
            self.attach_queue(queue)
            if queue.consumers:
                self.node.scheduler.wake(queue)

    def attach_session(self, session: ConnectionPort) -> None:
        chain = self._session_chain(session)
        session.stopped = self._summary(chain)["state"] == "stopped"
        session.limits = self._limits(chain, "msgs", "bytes")
        session.publish_limits = self._limits(chain, "publish_msgs", "publish_bytes")

    def attach_queue(self, queue: QueueRuntime) -> None:
        control = self._controls.get(key_of("queue", queue.definition.vhost, queue.name))
        state = control.state if control else None
        queue.paused = state == "stopped"
        queue.control_running = state == "running"
        buckets = self._buckets_of(control) if control else ControlBuckets()
        queue.rate_limit = buckets.msgs
        queue.byte_limit = buckets.bytes

    def _limits(self, chain: list[ConsumptionControl], msgs: str, size: str) -> Limits | None:
        """The buckets of ``chain`` for one direction (attributes ``msgs`` and ``size`` of
        ControlBuckets), as one Limits; None when no control in the chain sets a rate."""
        msg_buckets: list[TokenBucket] = []
        byte_buckets: list[TokenBucket] = []
        for control in chain:
            buckets = self._buckets_of(control)
            if (bucket := getattr(buckets, msgs)) is not None:
                msg_buckets.append(bucket)
            if (bucket := getattr(buckets, size)) is not None:
                byte_buckets.append(bucket)
        if not msg_buckets and not byte_buckets:
            return None
        return Limits(tuple(msg_buckets), tuple(byte_buckets), self.node.scheduler.clock.monotonic)

    def is_shared(self, key: Key) -> bool:
        """Its rates total over the gateways of a cluster (this gateway holds a share)."""
        return self.node.clustered and key[0] in SHARED_SCOPES

    def _buckets_of(self, control: ConsumptionControl) -> ControlBuckets:
        """The shared buckets of one control, made once per control and kept while its rates
        change (a shared one starts with no share: the next re-division gives it one)."""
        buckets = self._buckets.get(control.key)
        if buckets is None:
            now = self.node.scheduler.clock.monotonic()
            shared = self.is_shared(control.key)
            rates = [getattr(control, field) for field in RATE_FIELDS]
            made = [
                None if rate is None else TokenBucket(0.0 if shared else rate, now)
                for rate in rates
            ]
            buckets = self._buckets[control.key] = ControlBuckets(*made)
        return buckets

    def _rebucket(
        self, key: Key, before: ConsumptionControl | None, control: ConsumptionControl | None
    ) -> None:
        """The control of ``key`` goes from ``before`` to ``control`` (None: gone). A bucket
        is kept while its rate is set, so what it earned and its share stay: a local one takes
        the new rate; a shared one keeps its share of the new total until the next
        re-division."""
        old = self._buckets.pop(key, None)
        if old is None or control is None:
            return
        now = self.node.scheduler.clock.monotonic()
        shared = self.is_shared(key)
        kept: list[TokenBucket | None] = []
        for field, bucket in old.by_field().items():
            total = getattr(control, field)
            if total is None:
                kept.append(None)
            elif bucket is None:
                kept.append(TokenBucket(0.0 if shared else total, now))
            else:
                old_total = getattr(before, field) if before is not None else None
                if not shared:
                    bucket.set_rate(total, now)
                elif old_total:
                    bucket.set_rate(bucket.rate_per_s * total / old_total, now)
                kept.append(bucket)
        self._buckets[key] = ControlBuckets(*kept)

    # -- cluster shares (gateway/cluster/shares.py) ---------------------------------------

    def shared_buckets(self) -> list[tuple[Key, str, float, TokenBucket]]:
        """(control key, rate field, the control's total, this gateway's bucket) of every
        rate that totals over the cluster and has a bucket here."""
        found = []
        for key, buckets in self._buckets.items():
            control = self._controls.get(key)
            if control is None or not self.is_shared(key):
                continue
            for field, bucket in buckets.by_field().items():
                total = getattr(control, field)
                if bucket is not None and total is not None:
                    found.append((key, field, float(total), bucket))
        return found

    def this_gateway(self, key: Key) -> dict[str, Any] | None:
        """A shared control's rates on this gateway now (its share), None if not shared."""
        buckets = self._buckets.get(key)
        if not self.is_shared(key) or buckets is None:
            return None
        shares = {
            f: None if b is None else round(b.rate_per_s, 3) for f, b in buckets.by_field().items()
        }
        return {**shares, "share": self.share_note or "current"}

    def wake_consumers(self) -> None:
        """Shares changed: queues held by an empty bucket look again now."""
        for queue in self.node.all_queues():
            if queue.consumers:
                self.node.scheduler.wake(queue)


def describe(key: Key) -> str:
    scope, vhost, name = key
    if scope == "global":
        return "global"
    if scope == "queue":
        return f"queue '{name}' in vhost '{vhost}'"
    if scope == "vhost":
        return f"vhost '{vhost}'"
    return f"{scope} '{name}'"
