"""Gray release (docs/gray.md): which connections are gray, from their client property or an
operator's rule, and the switch back that waits for the gray partitions to drain.

A connection's color decides two things: where its publishes go (a gray publisher's messages,
and any message whose headers carry the gray marker, go to the gray partitions of a queue that
has them) and what its consumers read (gateway/queues/gray_lanes.py). Rules live in the
metadata store and reach every gateway on the change feed; the registry here keeps them, knows
the live connections, and colors them again when a rule changes.

Switching back with ``drain``: the connection's publishes turn normal at once; its consumers
stay on the gray partitions until, on every queue they read, the gray partitions hold nothing
unacked or ready from before the switch (the committed offset passed each partition's end as
it was then); then they move. A connection closed meanwhile is simply forgotten.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from gateway.features.broadcast import connection_name
from gateway.queues.consumer import LANE_ALL, LANE_GRAY, LANE_NORMAL
from gateway.queues.runtime import QueueRuntime
from meta.models import GrayEnd, GrayMatch, GrayRule
from storage import QUEUE_GROUP

log = logging.getLogger("mqgw.gray")

GRAY_PROPERTY = "mqgw-gray"  # client property: this connection is gray (true/false)
SWITCH_PROPERTY = "mqgw-gray-switch"  # client property: false turns gray handling off
GRAY_HEADER = "x-gray"  # a message header marking a message gray (the setting gray_header)
DRAIN_CHECK_S = 0.1
LANE_NAMES = {
    LANE_NORMAL: "normal",
    LANE_GRAY: "gray",
    LANE_ALL: "all",
}  # how often a pending switch back looks at its partitions


class GrayConnection(Protocol):
    """A connection as gray release sees it (the session)."""

    @property
    def name(self) -> str: ...
    @property
    def peer(self) -> str: ...
    @property
    def user(self) -> str: ...
    @property
    def client_properties(self) -> Mapping[str, Any]: ...

    gray_publish: bool  # its publishes are gray (read per publish into a gray queue)
    gray_lane: int  # what its consumers read: LANE_NORMAL, LANE_GRAY or LANE_ALL

    def consumed_queues(self) -> Iterable[QueueRuntime]:
        """The queues its consumers read."""
        ...


def matches(match: GrayMatch, connection: GrayConnection) -> bool:
    if match.connection_name is not None:
        name = connection_name(connection.client_properties)
        if not fnmatch.fnmatchcase(name, match.connection_name):
            return False
    if match.user is not None and connection.user != match.user:
        return False
    if match.address is not None:
        host = connection.peer.rsplit(":", 1)[0].strip("[]")
        try:
            if ipaddress.ip_address(host) not in ipaddress.ip_network(match.address, False):
                return False
        except ValueError:
            return False
    return True


def marked_gray(headers: Mapping[str, Any] | None, header: str = GRAY_HEADER) -> bool:
    """Whether a message's headers carry the gray marker (true, or the text "true")."""
    return headers is not None and _flag(headers.get(header)) is True


def _flag(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (str, bytes)):
        text = value.decode() if isinstance(value, bytes) else value
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
    return None


@dataclass(frozen=True)
class Color:
    """What a connection is: gray or not, and whether gray handling is on for it."""

    gray: bool
    switch: bool
    rule: str | None = None  # the operator's rule that decided, if one did
    drain: bool = False  # that rule switches back only once drained

    @property
    def lane(self) -> int:
        if not self.switch:
            return LANE_ALL
        return LANE_GRAY if self.gray else LANE_NORMAL


def color_of(rules: Iterable[GrayRule], connection: GrayConnection) -> Color:
    """An operator's rule beats the client property; rules are tried in name order."""
    properties = connection.client_properties
    gray = _flag(properties.get(GRAY_PROPERTY)) or False
    switch = _flag(properties.get(SWITCH_PROPERTY))
    for rule in sorted(rules, key=lambda r: r.name):
        if matches(rule.match, connection):
            on = switch if rule.switch is None else rule.switch
            return Color(rule.gray, on is not False, rule.name, rule.drain)
    return Color(gray, switch is not False)


@dataclass
class Drain:
    """A switch back waiting for the gray partitions its consumers read to drain."""

    rule: str | None
    ends: dict[tuple[int, int], int] = field(default_factory=dict)  # (queue id, p) -> end
    left: dict[tuple[int, int], int] = field(default_factory=dict)  # what remains, last look
    names: dict[int, str] = field(default_factory=dict)  # queue id -> "vhost/name"
    looked: bool = False


class GrayRegistry:
    """The operator's rules as this gateway knows them, and its connections' colors."""

    def __init__(self) -> None:
        self.rules: dict[str, GrayRule] = {}
        self.connections: dict[GrayConnection, Color] = {}
        self.drains: dict[GrayConnection, Drain] = {}
        self._drain_wake = anyio.Event()
        self.ends: dict[tuple[str, str], GrayEnd] = {}  # (vhost, queue): gray release ended
        # Set by the node: a queue's gray release ended (True) or resumed (False).
        self.on_end: Callable[[str, str, bool], None] = lambda _v, _q, _e: None

    # -- rules ------------------------------------------------------------------------------

    def load(self, rules: Iterable[GrayRule]) -> None:
        self.rules = {rule.name: rule for rule in rules}
        self.recolor()

    def rule_set(self, rule: GrayRule) -> None:
        if self.rules.get(rule.name) == rule:
            return  # the feed brings back what the admin API applied already
        self.rules[rule.name] = rule
        self.recolor()

    def rule_deleted(self, name: str) -> None:
        if self.rules.pop(name, None) is not None:
            self.recolor()

    # -- queues whose gray release ended ----------------------------------------------------

    def load_ends(self, ends: Iterable[GrayEnd]) -> None:
        before = set(self.ends)
        self.ends = {(end.vhost, end.queue): end for end in ends}
        for key in before - set(self.ends):
            self.on_end(*key, False)
        for key in self.ends:
            self.on_end(*key, True)

    def end_set(self, end: GrayEnd) -> None:
        self.ends[(end.vhost, end.queue)] = end
        self.on_end(end.vhost, end.queue, True)

    def end_deleted(self, vhost: str, queue: str) -> None:
        if self.ends.pop((vhost, queue), None) is not None:
            self.on_end(vhost, queue, False)

    def ended_in(self, vhost: str) -> set[str]:
        return {queue for v, queue in self.ends if v == vhost}

    # -- connections ------------------------------------------------------------------------

    def attach(self, connection: GrayConnection) -> None:
        """At connection.open: its color from its client properties and the rules."""
        color = color_of(self.rules.values(), connection)
        self.connections[connection] = color
        connection.gray_publish = color.gray and color.switch
        connection.gray_lane = color.lane

    def detach(self, connection: GrayConnection) -> None:
        self.connections.pop(connection, None)
        self.drains.pop(connection, None)

    def recolor(self) -> None:
        """Apply the rules to every live connection again (a rule changed)."""
        for connection in list(self.connections):
            self._apply(connection, color_of(self.rules.values(), connection))

    def _apply(self, connection: GrayConnection, color: Color) -> None:
        self.connections[connection] = color
        connection.gray_publish = color.gray and color.switch
        if color.lane == connection.gray_lane:
            self.drains.pop(connection, None)
            return
        if color.drain and connection.gray_lane == LANE_GRAY and color.lane == LANE_NORMAL:
            if connection not in self.drains:
                self.drains[connection] = Drain(color.rule)
                log.info("gray: connection %s switches back once its gray partitions are "
                         "drained (rule %r)", connection.name, color.rule)  # fmt: skip
                self._drain_wake.set()
            return
        self.drains.pop(connection, None)
        self._move(connection, color.lane)

    def _move(self, connection: GrayConnection, lane: int) -> None:
        connection.gray_lane = lane
        for queue in connection.consumed_queues():
            queue.consumers_changed()

    # -- draining ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Move the connections switching back once their gray partitions are drained."""
        while True:
            if not self.drains:
                self._drain_wake = anyio.Event()
                await self._drain_wake.wait()
            await self.check_drains()
            await anyio.sleep(DRAIN_CHECK_S)

    async def check_drains(self) -> None:
        for connection, drain in list(self.drains.items()):
            done = await self._drained(connection, drain)
            if done and self.drains.get(connection) is drain:
                del self.drains[connection]
                self._move(connection, LANE_NORMAL)
                log.info("gray: connection %s switched back to normal partitions (rule %r)",
                         connection.name, drain.rule)  # fmt: skip

    async def _drained(self, connection: GrayConnection, drain: Drain) -> bool:
        """Whether every gray partition its consumers read is settled past its end as it
        was when the switch back began (ends read once, at the first look)."""
        left: dict[tuple[int, int], int] = {}
        for queue in connection.consumed_queues():
            if not queue.gray_parts or queue.deleted:
                continue
            drain.names[queue.queue_id] = f"{queue.definition.vhost}/{queue.name}"
            stats = None
            for p in queue.gray_parts:
                key = (queue.queue_id, p)
                if key not in drain.ends:
                    if stats is None:
                        stats = await queue.store.queue_stats(queue.queue_id)
                    drain.ends[key] = stats.partitions[p].max_offset
                settled = await _settled_below(queue, p)
                if settled < drain.ends[key]:
                    left[key] = drain.ends[key] - settled
        drain.left = left
        drain.looked = True
        return not left

    def describe(self, connection: GrayConnection) -> dict[str, object]:
        """A connection's gray state, for the management API and the dashboard."""
        color = self.connections.get(connection)
        return {
            "publishes": "gray" if connection.gray_publish else "normal",
            "consumes": LANE_NAMES[connection.gray_lane],
            "rule": None if color is None else color.rule,
            "switching_back": connection in self.drains,
        }

    def status(self, name: str) -> dict[str, Any]:
        """What the rule does on this gateway now: the connections it decides, and for a
        draining switch back, what each still waits for."""
        ruled = [c.name for c, color in self.connections.items() if color.rule == name]
        pending = [
            {
                "connection": connection.name,
                "waiting_for": [
                    {"queue": drain.names.get(q, str(q)), "partition": p, "messages": n}
                    for (q, p), n in sorted(drain.left.items())
                ]
                if drain.looked
                else "the first look at its partitions",
            }
            for connection, drain in self.drains.items()
            if drain.rule == name
        ]
        return {"connections": sorted(ruled), "pending": pending}


async def end_ends(queue: QueueRuntime) -> dict[int, int]:
    """The queue's gray partitions and their end offsets now (where an end drains to)."""
    stats = await queue.store.queue_stats(queue.queue_id)
    return {p: stats.partitions[p].max_offset for p in queue.gray_parts}


async def end_progress(queue: QueueRuntime, ends: Mapping[int, int]) -> dict[str, object]:
    """How far the gray partitions of a queue whose gray release ended are drained: per
    partition the messages stored before the end and not yet settled (ready or unacked)."""
    left = []
    for p, end in sorted(ends.items()):
        if p < queue.partitions:
            settled = await _settled_below(queue, p)
            left.append({"partition": p, "messages": max(0, end - settled)})
    return {"partitions": left, "left": sum(int(x["messages"]) for x in left)}


async def _settled_below(queue: QueueRuntime, partition: int) -> int:
    """The lowest offset of ``partition`` not yet settled: this gateway's own view where it
    delivers the partition, the committed offset at the store otherwise (cluster)."""
    if queue.holds_lease(partition):
        return queue.committed_offsets()[partition]
    return await queue.store.committed_offset(QUEUE_GROUP, queue.queue_id, partition)
