"""How a broker takes part in a replicated group: its group and id, the replication mode
(``sync``: confirm once the in-sync replicas have the bytes; ``async``: after the master's own
flush), the controller's timing, the fetch sizes, and whether the replicas' promises may stand
in for Redis. Set once from `mqgw broker`'s flags (mqgw_cli/broker_command.py); read by the
replicated store (storage/replication/replicated_store.py) and its member.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from meta.groups.timing import ControllerConfig


class ReplicationMode(StrEnum):
    SYNC = "sync"
    ASYNC = "async"


@dataclass(frozen=True)
class ReplicationSettings:
    group: str
    broker_id: str
    mode: ReplicationMode = ReplicationMode.SYNC
    timing: ControllerConfig = field(default_factory=ControllerConfig)
    priority: int = 0
    fetch_bytes: int = 4 << 20
    fetch_wait_ms: int = 200
    # Standing from the in-sync replicas' promises when Redis does not answer (rule 14 in
    # docs/controller.md): safe only when min_in_sync is a majority of the group.
    replica_standing: bool = False
