"""Standing from the in-sync replicas (docs/controller.md, rule 14): with every Redis host
down a master goes on confirming while each replica it needs promised, in its last fetch, to
follow no other master for the master timeout; a replica under such a promise neither becomes
master nor follows another until it ran out; a fenced master's answers release the promise.
Time is the stores' own clock, set by hand."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from meta.groups.records import GroupRecord
from meta.groups.timing import ControllerConfig
from storage import Record
from storage.replication.member import ReplicationMember
from storage.replication.settings import ReplicationSettings
from storage.wire.replication import Replicated
from tests.replication.replicated import replicated_store

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

TIMING = ControllerConfig(min_in_sync=2)
RECORD = GroupRecord("g1", epoch=1, master="0", in_sync=frozenset("01"))


def _settings(broker_id: str, on: bool = True) -> ReplicationSettings:
    return ReplicationSettings("g1", broker_id, timing=TIMING, replica_standing=on)


def _fetch(offset: int, echo_ms: int | None) -> dict[str, Any]:
    head: dict[str, Any] = {"id": "1", "epoch": 1, "offset": offset, "wait_ms": 0}
    if echo_ms is not None:
        head.update(echo_ms=echo_ms, grant=True)
    return head


async def test_a_master_without_redis_confirms_on_its_replicas_promises(tmp_path: Path) -> None:
    now = [10_000]
    async with replicated_store(tmp_path, "0", _settings("0")) as store:
        store.now_ms = lambda: now[0]
        store.become_master(RECORD)  # no heartbeat answered: no standing from Redis
        assert not store.can_confirm()
        answer = await store.serve_fetch(_fetch(0, None))
        assert answer.head["sent_ms"] == 10_000 and answer.head["fenced"] is False
        await store.serve_fetch(_fetch(0, answer.head["sent_ms"]))  # the replica promised
        assert store.can_confirm() and store.accepting()
        await store.inner.create_queue(1, 1)
        result = await store.inner.append([Record(b"", b"q", b"", b"m", ((1, 0),))])
        store.confirm()
        assert store.confirmed < result.end_offset  # not acknowledged yet
        await store.serve_fetch(_fetch(result.end_offset, 10_000))
        assert store.confirmed == result.end_offset  # acknowledged, and promised
        now[0] = 10_000 + TIMING.master_timeout_ms  # the promise ran out
        assert not store.can_confirm()
        # Fenced (a switchover): promises are not taken, and answers say so.
        store.follow_standing(replace(RECORD, fence="1", fence_version=2), 1, now[0])
        answer = await store.serve_fetch(_fetch(result.end_offset, now[0]))
        assert answer.head["fenced"] is True and not store.can_confirm()


async def test_without_the_setting_or_below_min_in_sync_no_replica_gives_standing(
    tmp_path: Path,
) -> None:
    async with replicated_store(tmp_path, "0", _settings("0", on=False)) as store:
        store.now_ms = lambda: 10_000
        store.become_master(RECORD)
        await store.serve_fetch(_fetch(0, 10_000))
        assert not store.can_confirm()  # off: Redis alone gives standing, as before
    async with replicated_store(tmp_path / "alone", "0", _settings("0")) as store:
        store.now_ms = lambda: 10_000
        store.become_master(GroupRecord("g1", epoch=1, master="0", in_sync=frozenset("0")))
        assert not store.can_confirm()  # nobody to promise: no standing


async def test_a_replica_under_a_promise_waits_before_it_leads(tmp_path: Path) -> None:
    now = [50_000]
    async with replicated_store(tmp_path, "1", _settings("1")) as store:
        store.now_ms = lambda: now[0]
        member = ReplicationMember(store, None, "", lambda _a: None)  # type: ignore[arg-type]
        member._on_answer(RECORD, 1, now[0])
        assert member.following == ("0", 1)
        promise = member._promise("0", Replicated({"sent_ms": 7, "fenced": False}, b""))
        assert promise == {"echo_ms": 7, "grant": True}
        elected = GroupRecord("g1", epoch=2, version=5, master="1", in_sync=frozenset("1"))
        member._on_answer(elected, 2, now[0])
        assert store.role != "master" and member.following is None  # stopped following
        now[0] += TIMING.master_timeout_ms + TIMING.safety_margin_ms  # the promise ran out
        member._on_answer(elected, 3, now[0])
        assert store.role == "master" and store.role_epoch == 2
        # A fenced master's answer releases the promise at once.
        member._on_answer(GroupRecord("g1", epoch=3, version=9, master="0"), 4, now[0])
        assert member._promise("0", Replicated({"sent_ms": 8, "fenced": True}, b"")) == {}
        member._on_answer(GroupRecord("g1", epoch=4, version=12, master="2"), 5, now[0])
        assert member.following == ("2", 4)
        # Back from a restart: a promise made before the crash may still hold, to anyone.
        member.hold_after_restart()
        member._on_answer(GroupRecord("g1", epoch=5, version=15, master="0"), 6, now[0])
        assert member.following is None
        now[0] += TIMING.master_timeout_ms + TIMING.safety_margin_ms
        member._on_answer(GroupRecord("g1", epoch=5, version=15, master="0"), 7, now[0])
        assert member.following == ("0", 5)


async def test_a_stretch_of_confirms_ends_when_too_few_are_in_sync(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Nemesis seed 122: a master whose in-sync set shrank below --min-in-sync confirmed
    nothing more, but its stretch of confirms was never closed in its log; the checker took
    it as confirming for minutes, beside the next master. The stretch ends then, with the
    time of its last confirm."""
    now = [10_000]
    caplog.set_level("INFO", "mqgw.storage.replication")
    async with replicated_store(tmp_path, "0", _settings("0")) as store:
        store.now_ms = lambda: now[0]
        store.become_master(RECORD)
        answer = await store.serve_fetch(_fetch(0, None))
        await store.serve_fetch(_fetch(0, answer.head["sent_ms"]))  # promised: standing
        await store.inner.create_queue(1, 1)
        result = await store.inner.append([Record(b"", b"q", b"", b"m", ((1, 0),))])
        await store.serve_fetch(_fetch(result.end_offset, 10_000))
        store.confirm()
        assert store.confirmed == result.end_offset
        store.follow_standing(replace(RECORD, in_sync=frozenset("0")), 2, now[0])
        store.confirm()
        lines = [r.getMessage() for r in caplog.records if "as master at epoch" in r.getMessage()]
        assert lines[0] == f"broker 0 confirms as master at epoch 1 from offset {result.end_offset}"
        assert lines[-1].startswith("broker 0 confirmed as master at epoch 1 until ")
        assert lines[-1].endswith("(too few in sync)")
