"""One name per broker for people: ``broker-<group>-<id>``, as `mqgw cluster status`,
cluster.json, the compose file and the Helm chart name them. Redis, the controller and the
store protocol know a broker by its group and id alone (``g1``, ``0``); every line the CLI
prints about a broker uses this name instead.
"""

from __future__ import annotations

from collections.abc import Iterable

PREFIX = "broker-"


def broker_name(group: str, broker_id: str) -> str:
    return f"{PREFIX}{group}-{broker_id}"


def broker_names(group: str, broker_ids: Iterable[str]) -> str:
    """``broker-g1-0, broker-g1-1``: a set of ids of ``group``, sorted, for a message."""
    return ", ".join(broker_name(group, i) for i in sorted(broker_ids)) or "none"


def broker_id(group: str, text: str) -> str:
    """The id a user named in ``group``: ``broker-g1-1`` (as status shows it) or the bare id
    ``1``. ValueError for a broker name of another group."""
    own = broker_name(group, "")
    if text.startswith(own) and len(text) > len(own):
        return text[len(own) :]
    if text.startswith(PREFIX):
        raise ValueError(f"{text} is not a broker of group {group} (its brokers are {own}ID)")
    return text
