"""place_slots: each gateway's place among those with consumers on a spread queue, from the
same claims on every gateway; queues that may not be spread, or have no consumer here, hold
no slot; what changed is returned (to be woken)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import anyio

from gateway.cluster.delivery_spread import place_slots


@dataclass
class Queue:
    name: str
    partitions: int = 4
    consumers: list[object] = field(default_factory=lambda: [object()])
    spreads: bool = True
    leases: list[bool] | None = field(default_factory=lambda: [False] * 4)
    deleted: bool = False
    delivery_slot: tuple[int, int] | None = None
    definition: Any = field(default_factory=lambda: SimpleNamespace(vhost="/"))

    def spreads_delivery(self) -> bool:
        return self.spreads


def _place(queues: list[Queue], claims: dict[str, list[str]], me: str) -> list[str]:
    asked: list[list[tuple[str, str]]] = []

    async def claimers(keys: list[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
        asked.append(keys)
        return {key: sorted(claims.get(key[1], [])) for key in keys}

    stand_ins: list[Any] = list(queues)  # the runtime's attributes place_slots reads
    changed = anyio.run(place_slots, stand_ins, claimers, me)
    assert len(asked) == 1  # one round trip for every queue
    return [q.name for q in changed]


def test_every_gateway_takes_its_place_by_sorted_name() -> None:
    claims = {"hot": ["gw-b", "gw-a", "gw-c"]}
    places = {}
    for me in ("gw-a", "gw-b", "gw-c"):
        queue = Queue("hot")
        assert _place([queue], claims, me) == ["hot"]
        places[me] = queue.delivery_slot
    assert places == {"gw-a": (0, 3), "gw-b": (1, 3), "gw-c": (2, 3)}


def test_only_spreadable_queues_with_consumers_here_hold_a_slot() -> None:
    claims = {name: ["gw-a", "gw-b"] for name in ("hot", "single", "one", "alone", "gone")}
    hot = Queue("hot")
    single = Queue("single", spreads=False, delivery_slot=(0, 2))  # e.g. x-max-length set
    one = Queue("one", partitions=1)
    alone = Queue("alone", leases=None)  # embedded node: no leases, nothing to spread
    idle = Queue("gone", consumers=[], delivery_slot=(1, 2))  # its consumer left
    changed = _place([hot, single, one, alone, idle], claims, "gw-b")
    assert hot.delivery_slot == (1, 2)
    assert single.delivery_slot is None and idle.delivery_slot is None
    assert one.delivery_slot is None and alone.delivery_slot is None
    assert sorted(changed) == ["gone", "hot", "single"]


def test_a_claim_not_seen_yet_leaves_no_slot_and_an_unchanged_one_is_not_woken() -> None:
    queue = Queue("hot")
    assert _place([queue], {"hot": ["gw-a"]}, "gw-b") == []  # gw-b's claim not in Redis yet
    assert queue.delivery_slot is None
    assert _place([queue], {"hot": ["gw-a", "gw-b"]}, "gw-b") == ["hot"]
    assert _place([queue], {"hot": ["gw-a", "gw-b"]}, "gw-b") == []
    assert queue.delivery_slot == (1, 2)
