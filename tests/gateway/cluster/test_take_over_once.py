"""Two tasks on one gateway (a basic.get's and the lease loop) may take the same delivery
lease at once: both calls to Redis answer "yours". Only one may take the partition over. A
second take-over started from the committed offset without the note and delivered again,
flagged, what the first had handed out (seen once in CI: tests/cluster/test_get_handover.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import anyio

from gateway.cluster.delivery_leases import DeliveryLeases


@dataclass
class Lease:
    mine: bool = True
    holder: str = "gw-a"
    token: int = 7
    taken: bool = True
    handed: Any = "note"


class SlowMeta:
    """Redis, as both tasks see it: each take answers "yours" after the other has asked."""

    def __init__(self) -> None:
        self.asked = 0
        self.both_asked = anyio.Event()

    async def take_lease(self, *_args: Any) -> Lease:
        self.asked += 1
        if self.asked == 2:
            self.both_asked.set()
        await self.both_asked.wait()
        return Lease()


@dataclass
class Queue:
    queue_id: int = 1
    name: str = "jobs"
    leases: list[bool] = field(default_factory=lambda: [False])
    fences: list[int] = field(default_factory=lambda: [0])
    taken_with: list[Any] = field(default_factory=list)

    async def take_over(self, partition: int, handed: Any = None) -> None:
        self.taken_with.append(handed)
        await anyio.sleep(0.01)  # the broker's reads
        self.leases[partition] = True


def test_a_lease_taken_by_two_tasks_at_once_is_taken_over_once() -> None:
    async def scenario() -> None:
        queue = Queue()
        node: Any = SimpleNamespace(scheduler=SimpleNamespace(wake=lambda _q: None))
        meta: Any = SlowMeta()
        leases = DeliveryLeases(node, meta, "gw-a")
        stand_in: Any = queue
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(leases.try_hold, stand_in, 0)
            tasks.start_soon(leases.try_hold, stand_in, 0)
        assert queue.taken_with == ["note"]  # once, with the last holder's note
        assert leases.held == {(1, 0): 7} and queue.leases == [True]

    anyio.run(scenario)
