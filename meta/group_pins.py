"""Tenant isolation (vivo's "business traffic isolation", docs/elastic-queues.md): a queue
pinned to broker groups by its ``x-mqgw-groups`` argument, else the ``groups`` key of its
policy, else its vhost's ``default_groups``. A list of group names, or one string of them
separated by commas; none means any group. Its partitions are placed, grown and moved only
there (a move elsewhere is refused: it would break the pin)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GROUPS_ARG = "x-mqgw-groups"
GROUPS_KEY = "groups"  # the policy key


class PinInvalid(ValueError):
    """Not a list of broker group names."""


def parse_groups(value: Any) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(g, str) for g in items):
        raise PinInvalid(f'broker groups are a list of names or "g1,g2", not {value!r}')
    groups = tuple(dict.fromkeys(g.strip() for g in items if g.strip()))
    if not groups:
        raise PinInvalid("name at least one broker group")
    return groups


def pinned_groups(
    arguments: Mapping[str, Any], policy: Mapping[str, Any] | None, vhost_default: tuple[str, ...]
) -> tuple[str, ...]:
    """The groups a queue may use (argument, then policy, then vhost); () for any."""
    for value in (arguments.get(GROUPS_ARG), (policy or {}).get(GROUPS_KEY)):
        if value is not None:
            try:
                return parse_groups(value)
            except PinInvalid:
                continue  # checked where it was set; a stray value pins nothing
    return vhost_default
