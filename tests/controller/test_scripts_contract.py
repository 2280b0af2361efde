"""The Lua scripts on a real redis-server and the simulation's model of them (sim/store.py)
answer the same calls the same way: the simulation checks the scripts the controller runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from controller import actions as a
from controller.apply import RedisApply
from controller.events import LeaseAcquired, LeaseLost
from controller.sim.store import StoreModel
from controller.snapshot import Snapshot
from meta.groups.keys import ControllerKeys
from meta.groups.link import GroupLink
from meta.groups.records import GroupRecord, LagReport, ReplicaReport
from meta.groups.timing import ControllerConfig
from tests.harness.redis_server import RedisServer

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]
S = frozenset
NEVER_SILENT = 10**12  # an election silence no heartbeat age reaches: only "stopped" passes


FRESH = ReplicaReport("g", "", seq=0, epoch=0, role="none", log_epoch=0, end=0, confirmed=0)


def hb(broker: str, seq: int, **kw: Any) -> ReplicaReport:
    return replace(FRESH, broker_id=broker, seq=seq, **kw)


def elect(master: str, version: int, epoch: int, in_sync: str, **kw: Any) -> a.Elect:
    chosen = a.Elect("g", master, epoch + 1, S(in_sync), epoch, version, "", "test")
    return replace(chosen, **kw)


# (operation, arguments): "hold" holder; "beat" report, lag; "write" holder, token, action,
# silence ms.
STEPS: list[tuple[str, tuple[Any, ...]]] = [
    ("hold", ("c1",)),
    ("hold", ("c2",)),
    ("beat", (hb("a", 1), None)),
    ("beat", (hb("b", 1, priority=1), None)),
    ("write", ("c1", 1, elect("a", 0, 0, "a"), NEVER_SILENT)),  # first master: no old one
    ("write", ("c1", 1, elect("a", 0, 0, "a"), NEVER_SILENT)),  # stale version
    ("write", ("c2", 1, elect("b", 1, 1, "b"), 0)),  # not the leader
    ("write", ("c1", 2, elect("b", 1, 1, "b"), 0)),  # not the leader's token
    ("beat", (hb("a", 2, epoch=1, role="master"), LagReport("g", "a", 1, caught_up=S("b")))),
    ("write", ("c1", 1, a.SetInSync("g", 1, 1, S("abc"), S("bc"), "t"), 0)),  # c not asked
    ("write", ("c1", 1, a.SetInSync("g", 0, 1, S("ab"), S("b"), "t"), 0)),  # wrong epoch
    ("write", ("c1", 1, a.SetInSync("g", 1, 1, S("b"), S("b"), "t"), 0)),  # master left out
    ("write", ("c1", 1, a.SetInSync("g", 1, 1, S("ab"), S("b"), "t"), 0)),
    ("write", ("c1", 1, elect("b", 2, 1, "b"), NEVER_SILENT)),  # master may confirm
    ("write", ("c1", 1, a.StopConfirming("g", 1, 2, "c", "r1"), 0)),  # c not in sync
    ("write", ("c1", 1, a.StopConfirming("g", 1, 2, "b", "r1"), 0)),
    ("write", ("c1", 1, a.StopConfirming("g", 1, 3, "b", "r2"), 0)),  # already fenced
    ("write", ("c1", 1, elect("b", 3, 1, "b"), NEVER_SILENT)),  # fence not obeyed yet
    ("beat", (hb("a", 4, epoch=1, role="master", fenced_version=3), None)),
    ("beat", (hb("a", 3, epoch=1, role="master"), None)),  # overtaken: not stored
    ("write", ("c1", 1, elect("b", 3, 1, "b", min_epoch=1), NEVER_SILENT)),  # fenced: ok
    ("write", ("c1", 1, a.ResumeConfirming("g", 2, 4, "t"), 0)),  # no fence to lift
    ("write", ("c1", 1, a.MarkDown("g", 4, S("a")), 0)),
    ("beat", (hb("b", 2, epoch=2, role="master"), None)),
    ("beat", (hb("c", 1, epoch=2, end=9), None)),
    ("write", ("c1", 1, elect("c", 5, 2, "c"), NEVER_SILENT)),  # b may confirm
    ("beat", (hb("b", 1 << 32, epoch=2, resigned_epoch=2), None)),  # b restarted
    ("write", ("c1", 1, elect("c", 5, 2, "c"), NEVER_SILENT)),  # resigned, but c not in sync
    ("write", ("c1", 1, elect("c", 5, 2, "bc", min_epoch=7, unclean=True), NEVER_SILENT)),
    ("write", ("c1", 1, elect("b", 6, 7, "bc"), 0)),  # silence 0: c counts as silent
    # A rescue: the target may be outside the in-sync set (a plain switchover's may not).
    ("write", ("c1", 1, a.StopConfirming("g", 8, 7, "a", "r3"), 0)),  # a not in sync
    ("write", ("c1", 1, a.StopConfirming("g", 8, 7, "a", "rescue", rescue=True), 0)),
    # After Redis lost writes: one write leaps past any version a broker may follow.
    ("write", ("c1", 1, a.MarkDown("g", 8, S("c"), jump=1000), 0)),
]


def comparable(snapshot: Snapshot) -> tuple[Any, ...]:
    """A snapshot without what depends on the clock."""
    records = tuple(replace(r, changed_ms=0) for r in snapshot.records)
    replicas = tuple((replace(r, at_ms=0), lag) for r, lag in snapshot.replicas)
    return snapshot.lease_holder, records, replicas


def result_of(result: a.WriteResult) -> tuple[bool, str, GroupRecord | None]:
    record = replace(result.record, changed_ms=0) if result.record is not None else None
    return result.ok, result.reason, record


@dataclass
class Real:
    client: Redis
    link: GroupLink
    applies: dict[str, RedisApply]

    async def run(self, operation: str, args: tuple[Any, ...]) -> Any:
        if operation == "hold":
            return await self.applies[args[0]].hold()
        if operation == "beat":
            _, record = await self.link.heartbeat(*args)
            return replace(record, changed_ms=0)
        holder, token, action, silence_ms = args
        apply = self.applies[holder]
        apply.config = replace(apply.config, master_timeout_ms=silence_ms, safety_margin_ms=0)
        return result_of(await apply.write(action, token))

    async def snapshot(self) -> tuple[Any, ...]:
        return comparable(await self.applies["c1"].read())


class Model:
    def __init__(self) -> None:
        self.store = StoreModel()
        self.now = 10**12

    async def run(self, operation: str, args: tuple[Any, ...]) -> Any:
        self.now += 1
        if operation == "hold":
            return self.store.hold(args[0], 60_000, self.now)
        if operation == "beat":
            report, lag = args
            return replace(self.store.heartbeat(report, lag, self.now), changed_ms=0)
        holder, token, action, silence_ms = args
        return result_of(self.store.write(holder, token, action, silence_ms, self.now))

    async def snapshot(self) -> tuple[Any, ...]:
        return comparable(self.store.snapshot(self.now, "run"))


@pytest.fixture
async def real(tmp_path: Path) -> AsyncIterator[Real]:
    with RedisServer(tmp_path / "redis") as server:
        client = Redis.from_url(server.url, decode_responses=True, protocol=2)
        keys = ControllerKeys()
        config = ControllerConfig(lease_ms=60_000)
        applies = {name: RedisApply(client, keys, name, config) for name in ("c1", "c2")}
        for name, apply in applies.items():
            apply.holder = name
        yield Real(client, GroupLink(client, keys), applies)
        await client.aclose()


async def test_scripts_and_model_agree(real: Real) -> None:
    model = Model()
    for number, (operation, args) in enumerate(STEPS):
        got, expected = await real.run(operation, args), await model.run(operation, args)
        if isinstance(expected, LeaseAcquired | LeaseLost):  # expiry is clock-dependent
            got, expected = type(got), type(expected)
        assert got == expected, f"step {number}: {operation} {args}"
        assert await real.snapshot() == await model.snapshot(), f"after step {number}"
    # The record went where the steps lead, and each landed write is on the change stream.
    (record,) = (await real.snapshot())[1]
    assert (record.epoch, record.master, record.in_sync, record.version) == (
        8, "b", S("bc"), 1009
    )  # fmt: skip
    assert (record.fence, record.fence_version) == ("a", 8)  # the rescue's
    kinds = [fields["kind"] for _, fields in await real.link.changes()]
    assert kinds == ["group.master", "group.in_sync", "group.fence", "group.master",
                     "group.master", "group.master", "group.fence"]  # fmt: skip


async def test_a_restarted_controller_is_a_new_holder(real: Real) -> None:
    first = RedisApply(real.client, ControllerKeys(), "c", ControllerConfig(lease_ms=60_000))
    again = RedisApply(real.client, ControllerKeys(), "c", ControllerConfig(lease_ms=60_000))
    assert isinstance(await first.hold(), LeaseAcquired)
    assert await again.hold() == LeaseLost(first.holder)
    await first.release()
    assert isinstance(await again.hold(), LeaseAcquired)
