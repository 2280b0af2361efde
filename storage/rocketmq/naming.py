"""Names of mqgw's queues and groups in RocketMQ, under a namespace (several mqgw clusters
may share one RocketMQ; the URL's path names it, ``mqgw`` by default).

RocketMQ accepts ``[%|a-zA-Z0-9_-]`` in topic and group names; a group name with other
characters keeps its legal ones and gets a hash of the whole (names stay readable in
RocketMQ's console, and distinct).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache

from storage.results import QUEUE_GROUP

_ILLEGAL = re.compile(r"[^a-zA-Z0-9_-]")
_NAMESPACE = re.compile(r"^[a-zA-Z0-9_-]{1,40}$")


@dataclass(frozen=True, slots=True)
class Names:
    namespace: str = "mqgw"

    def __post_init__(self) -> None:
        if not _NAMESPACE.match(self.namespace):
            raise ValueError(f"rocketmq namespace {self.namespace!r}: use 1-40 of [a-zA-Z0-9_-]")

    def topic(self, queue_id: int) -> str:
        return f"{self.namespace}_q{queue_id}"

    def queue_of(self, topic: str) -> int | None:
        prefix = f"{self.namespace}_q"
        if topic.startswith(prefix) and topic[len(prefix) :].isdigit():
            return int(topic[len(prefix) :])
        return None

    def group(self, group: str) -> str:
        """The RocketMQ consumer group holding ``group``'s offsets."""
        return f"{self.namespace}_{_legal(group)}"

    def fence_group(self, group: str) -> str:
        """Holds the highest fencing token of ``group`` per partition, as an offset."""
        return f"{self.group(group)}_fence"

    @property
    def floor_group(self) -> str:
        """Holds each partition's purge floor, as an offset."""
        return f"{self.namespace}_floor"

    @property
    def reader_group(self) -> str:
        """The group pulls are made in (they commit nothing)."""
        return f"{self.namespace}_reader"


@lru_cache(maxsize=1024)
def _legal(group: str) -> str:
    if group == QUEUE_GROUP:
        return "queue"
    cleaned = _ILLEGAL.sub("_", group)
    if cleaned == group:
        return "g_" + group
    return f"g_{cleaned}_{hashlib.sha1(group.encode()).hexdigest()[:8]}"
