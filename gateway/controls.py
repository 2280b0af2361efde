"""Consumption controls: an operator's stop/start and rate limits, by scope (vivo's design).

Scopes, widest first: global, node, client (connection_name or source address, now and
later), connection (one open connection), queue. For stop/start the narrowest control that
sets a state wins; every rate limit that applies binds (the tightest one does).

How they act, inside the push scheduler and basic.get, never on publishing:
- a queue whose own control says stopped is paused (the scheduler skips it);
- a connection's state and limits come from the global, node, client and connection scopes:
  ``session.stopped`` and ``session.limits`` are read by ``Consumer.has_credit``, so a
  stopped connection's consumers simply have no credit until it starts again, while unacked
  deliveries stay with them and acks keep working; a queue whose own control says running
  overrides a wider stop (``queue.control_running``);
- rate limits are token buckets shared by everything in the scope; the global one is divided
  by the number of gateways, so that in a cluster the limit is the total over all of them.

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
from gateway.queues.rate_limit import Limits, TokenBucket
from meta.models import CONTROL_SCOPES, ConsumptionControl, ControlScope

if TYPE_CHECKING:
    from gateway.queues.runtime import QueueRuntime

log = logging.getLogger("mqgw.controls")

Key = tuple[str, str, str]  # (scope, vhost, name)


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
        self._buckets: dict[Key, tuple[TokenBucket | None, TokenBucket | None]] = {}

    # -- reading --------------------------------------------------------------------------

    def all(self) -> list[ConsumptionControl]:
        order = {scope: i for i, scope in enumerate(CONTROL_SCOPES)}
        return sorted(self._controls.values(), key=lambda c: (order[c.scope], c.vhost, c.name))

    def get(self, key: Key) -> ConsumptionControl | None:
        return self._controls.get(key)

    def _session_chain(self, session: ConnectionPort) -> list[ConsumptionControl]:
        """The controls that apply to a connection, widest first."""
        keys = [key_of("global"), key_of("node", name=self.node.name)]
        keys.append(key_of("client", name=client_address(session)))
        client = connection_name(session.client_properties)
        if client:  # after the address: a control for the name is the more specific one
            keys.append(key_of("client", name=client))
        keys.append(key_of("connection", name=session.name))
        return [c for c in (self._controls.get(k) for k in keys) if c is not None]

    def _queue_chain(self, vhost: str, queue: str) -> list[ConsumptionControl]:
        """The controls that apply to a queue whatever the consumer's connection."""
        keys = [key_of("global"), key_of("node", name=self.node.name)]
        keys.append(key_of("queue", vhost, queue))
        return [c for c in (self._controls.get(k) for k in keys) if c is not None]

    @staticmethod
    def _summary(chain: Iterable[ConsumptionControl]) -> dict[str, Any]:
        state, state_scope = "running", None
        rate_msgs: float | None = None
        rate_bytes: float | None = None
        for control in chain:  # widest first: a narrower state overrides
            if control.state is not None:
                state, state_scope = control.state, control.scope
            if control.rate_msgs is not None:
                rate_msgs = min(rate_msgs or control.rate_msgs, control.rate_msgs)
            if control.rate_bytes is not None:
                rate_bytes = min(rate_bytes or control.rate_bytes, control.rate_bytes)
        return {
            "state": state,
            "state_set_at_scope": state_scope,
            "rate_msgs": rate_msgs,
            "rate_bytes": rate_bytes,
        }

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
        for key in [k for k, c in self._controls.items() if controls.get(k) != c]:
            self._buckets.pop(key, None)
        self._controls = controls
        self.apply()

    async def update(self, key: Key, changes: dict[str, Any], user: str) -> ConsumptionControl:
        """Merge ``changes`` (state, rate_msgs, rate_bytes; None clears one) into the control
        of ``key`` and apply it; a control left with nothing in it is removed."""
        scope, vhost, name = key
        current = self._controls.get(key)
        fields = {
            "state": current.state if current else None,
            "rate_msgs": current.rate_msgs if current else None,
            "rate_bytes": current.rate_bytes if current else None,
        }
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
        self._controls[key] = control
        self._buckets.pop(key, None)
        log.info(
            "consumption control %s: %s, rate %s msgs/s, %s bytes/s (set by %s)",
            describe(key),
            control.state or "state inherited",
            control.rate_msgs or "unlimited",
            control.rate_bytes or "unlimited",
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
        for key in [k for k in self._controls if k[0] == "queue" and k[1] == vhost]:
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
        session.limits = self._limits(chain)

    def attach_queue(self, queue: QueueRuntime) -> None:
        control = self._controls.get(key_of("queue", queue.definition.vhost, queue.name))
        state = control.state if control else None
        queue.paused = state == "stopped"
        queue.control_running = state == "running"
        msgs, size = self._buckets_of(control) if control else (None, None)
        queue.rate_limit = msgs
        queue.byte_limit = size

    def _limits(self, chain: list[ConsumptionControl]) -> Limits | None:
        msg_buckets: list[TokenBucket] = []
        byte_buckets: list[TokenBucket] = []
        for control in chain:
            msgs, size = self._buckets_of(control)
            if msgs is not None:
                msg_buckets.append(msgs)
            if size is not None:
                byte_buckets.append(size)
        if not msg_buckets and not byte_buckets:
            return None
        return Limits(tuple(msg_buckets), tuple(byte_buckets), self.node.scheduler.clock.monotonic)

    def _buckets_of(
        self, control: ConsumptionControl
    ) -> tuple[TokenBucket | None, TokenBucket | None]:
        """The shared buckets of one control, made once per (control, rate)."""
        buckets = self._buckets.get(control.key)
        if buckets is None:
            share = self.node.gateway_count() if control.scope == "global" else 1
            now = self.node.scheduler.clock.monotonic()
            buckets = (
                None if control.rate_msgs is None else TokenBucket(control.rate_msgs / share, now),
                None
                if control.rate_bytes is None
                else TokenBucket(control.rate_bytes / share, now),
            )
            self._buckets[control.key] = buckets
        return buckets


def describe(key: Key) -> str:
    scope, vhost, name = key
    if scope == "global":
        return "global"
    if scope == "queue":
        return f"queue '{name}' in vhost '{vhost}'"
    return f"{scope} '{name}'"
