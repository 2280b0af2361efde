"""The group move job as the cluster's (gateway/vhost/group_mover.py), over an in-memory
record and lease (the real one, on Redis, is tests/meta/test_move_jobs.py; a gateway killed
mid-drain is tests/cluster/test_group_moves.py): one job at a time cluster-wide, a job
resumed from the move it was at, progress recorded after every move, and a runner that lost
its lease stops."""

from __future__ import annotations

import json

import anyio
import pytest

from gateway.vhost.group_mover import GroupMover, JobRunning
from gateway.vhost.group_moves import MoveJob, run_job
from gateway.vhost.group_plans import Move
from gateway.vhost.rescale import RouteKeeper

pytestmark = pytest.mark.anyio


class Lease:
    """One record and one lease, shared by the gateways' ``Records``."""

    def __init__(self) -> None:
        self.holder: str | None = None
        self.record: str | None = None
        self.saves: list[dict[str, object]] = []


class Records:
    def __init__(self, lease: Lease, owner: str) -> None:
        self.lease, self.owner = lease, owner

    async def claim(self) -> bool:
        if self.lease.holder not in (None, self.owner):
            return False
        self.lease.holder = self.owner
        return True

    async def save(self, record: str) -> bool:
        if self.lease.holder != self.owner:
            return False
        self.lease.record = record
        self.lease.saves.append(json.loads(record))
        return True

    async def load(self) -> str | None:
        return self.lease.record

    async def release(self) -> None:
        if self.lease.holder == self.owner:
            self.lease.holder = None


def moves(count: int) -> list[Move]:
    return [Move("/", f"q{n}", 0, "g1", "g2", 10) for n in range(count)]


def mover(lease: Lease, name: str) -> GroupMover:
    made = GroupMover(lambda vhost: None, RouteKeeper(lambda: iter(())))
    made.records = Records(lease, name)
    return made


async def test_one_job_for_the_cluster_and_the_record_shows_it_everywhere() -> None:
    lease = Lease()
    one, two = mover(lease, "gw1"), mover(lease, "gw2")
    await one.start(MoveJob("drain g1", moves(3), 60.0))
    with pytest.raises(JobRunning):
        await two.start(MoveJob("rebalance", moves(1), 60.0))
    shown = await two.shown()
    assert shown is not None
    assert (shown["kind"], shown["state"], shown["gateway"]) == ("drain g1", "running", "gw1")
    assert "next" not in shown  # the resuming fields stay private


async def test_a_lapsed_job_is_resumed_from_the_move_it_was_at() -> None:
    lease = Lease()
    one, two = mover(lease, "gw1"), mover(lease, "gw2")
    job = MoveJob("drain g1", moves(4), 60.0, done=2, next=2)
    await one.start(job)
    await two._take_over(two.records)  # type: ignore[arg-type]
    assert two.job is None  # gw1 holds the lease: nothing taken
    lease.holder = None  # gw1 died: its lease lapsed
    await two._take_over(two.records)  # type: ignore[arg-type]
    taken = two.job
    assert taken is not None
    assert (taken.job_id, taken.next, taken.done) == (job.job_id, 2, 2)
    assert (taken.runner, taken.resumed_by) == ("gw2", ["gw2"])
    assert [m.queue for m in taken.moves] == ["q0", "q1", "q2", "q3"]
    assert lease.saves[-1]["gateway"] == "gw2"


async def test_progress_is_recorded_per_move_and_a_fenced_runner_stops() -> None:
    lease = Lease()
    one = mover(lease, "gw1")
    job = MoveJob("drain g1", moves(3), 0.0)  # the queues are gone: each move fails fast
    await one.start(job)
    with anyio.fail_after(5):
        await run_job(job, lambda vhost: None, one.keeper, one._progress)
    assert [s["next"] for s in lease.saves] == [0, 1, 2, 3]
    assert lease.saves[-1]["state"] == "finished" and len(job.failed) == 3
    assert lease.holder is None  # released at the end

    fenced = MoveJob("drain g1", moves(3), 0.0)
    await one.start(fenced)
    lease.holder = "gw2"  # gw1 was paused past its lease; gw2 took the job over
    with anyio.fail_after(5):
        await run_job(fenced, lambda vhost: None, one.keeper, one._progress)
    assert fenced.next == 1 and not one.busy()  # stopped after the move it was at
