"""Draining a broker group and rebalancing the cluster (docs/elastic-queues.md): the loads
measured from the store, a plan (gateway/vhost/group_plans.py), and the job that carries it
out, one move at a time (gateway/vhost/group_mover.py runs it, and resumes it on another
gateway when the one running it dies).

A move is the queue's own (gateway/vhost/elastic.py for a plain queue, a ``move`` step for a
keyed-order one): writes go to a new partition on the target group at once, the backlog is
consumed where it is, and the old partition is removed once drained. The job waits for each
move to complete before the next (one change at a time per queue, and a bounded rate:
``per_minute``), logs a line per move and a summary at the end, and shows its progress in
``MoveJob.view`` (GET /api/cluster/moves). A move is safe to ask twice: one whose partition
is no longer open on its source was made already (by the job's last runner), and is only
waited for.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import anyio

from gateway.features.queue_kinds import scale_refusal
from gateway.queues.ordered import OrderedRuntime
from gateway.queues.runtime import QueueRuntime
from gateway.vhost import elastic, keyed_routes
from gateway.vhost.group_plans import Move, PartitionLoad
from gateway.vhost.host import VirtualHost
from gateway.vhost.rescale import RouteKeeper, Step, apply_step, settled
from meta.errors import MetaError, RouteConflict
from meta.queue_route import RouteRefused
from storage import StoreError

log = logging.getLogger("mqgw.rescale")
MOVE_TIMEOUT_S = 300.0  # a move whose backlog is not consumed by then fails the job
POLL_S = 0.05

Queues = Callable[[], Iterable[tuple[VirtualHost, QueueRuntime]]]


async def measure(queues: Queues, window_s: float) -> list[PartitionLoad]:
    """Each placed partition not removed, weighed by what was published to it during
    ``window_s`` plus its backlog (at least 1)."""
    placed = [(h, q) for h, q in queues() if h.placement is not None and not q.deleted]
    first = {q.queue_id: await _ends(q) for _, q in placed}
    await anyio.sleep(window_s)
    loads = []
    for host, queue in placed:
        assert host.placement is not None
        groups = host.placement(queue.queue_id)
        if not groups:
            continue
        try:
            stats = await queue.store.queue_stats(queue.queue_id)
        except StoreError:
            continue
        fixed = _fixed(queue)
        pins = host.pins(queue.definition)
        before = first.get(queue.queue_id, {})
        for part in stats.partitions:
            p = part.partition
            if p >= len(groups) or not _counted(queue, p):
                continue
            grown = part.max_offset - before.get(p, part.max_offset)
            weight = 1 + max(0, grown) + max(0, part.ready)
            loads.append(PartitionLoad(host.name, queue.name, p, groups[p], weight, fixed, pins))
    return loads


def _counted(queue: QueueRuntime, partition: int) -> bool:
    """Only open partitions move (one closing or draining is on its way out already, a
    removed one is gone)."""
    route = queue.route
    if route is None:
        return True
    return partition < len(route.partitions) and route.partitions[partition].state == "open"


def _fixed(queue: QueueRuntime) -> str | None:
    refusal = scale_refusal(queue)
    return None if refusal is None else f"{queue.name}: {refusal}"


async def _ends(queue: QueueRuntime) -> dict[int, int]:
    try:
        stats = await queue.store.queue_stats(queue.queue_id)
    except StoreError:
        return {}
    return {p.partition: p.max_offset for p in stats.partitions}


@dataclass
class MoveJob:
    kind: str  # "rebalance" or "drain g2"
    moves: list[Move]
    per_minute: float
    done: int = 0
    failed: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    current: Move | None = None
    # What another gateway needs to resume it (gateway/vhost/group_mover.py).
    job_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    next: int = 0  # the index of the first move not yet completed or failed
    runner: str = ""  # the gateway running it
    resumed_by: list[str] = field(default_factory=list)
    started_wall: float = field(default_factory=time.time)

    def view(self) -> dict[str, Any]:
        took = (self.finished or time.monotonic()) - self.started
        return {
            "id": self.job_id,
            "kind": self.kind,
            "state": "running" if self.finished is None else "finished",
            "gateway": self.runner,
            "resumed_by": self.resumed_by,
            "planned": len(self.moves),
            "done": self.done,
            "failed": self.failed,
            "current": None if self.current is None else _move_json(self.current),
            "seconds": round(took, 2),
            "partitions_per_minute": round(self.done * 60 / took, 1) if took > 0 else None,
            "moves": [_move_json(m) for m in self.moves],
        }

    def record(self) -> dict[str, Any]:
        """The view, with what resuming needs."""
        return {**self.view(), "next": self.next, "per_minute": self.per_minute,
                "started_wall": self.started_wall}  # fmt: skip

    @classmethod
    def resumed(cls, record: dict[str, Any], runner: str) -> MoveJob:
        """The job of ``record`` (``MoveJob.record``), to be carried on by ``runner``."""
        moves = [Move(m["vhost"], m["queue"], int(m["partition"]), m["from"], m["to"],
                      int(m["weight"])) for m in record["moves"]]  # fmt: skip
        started_wall = float(record["started_wall"])
        return cls(
            kind=str(record["kind"]),
            moves=moves,
            per_minute=float(record["per_minute"]),
            done=int(record["done"]),
            failed=[str(f) for f in record["failed"]],
            started=time.monotonic() - max(0.0, time.time() - started_wall),
            job_id=str(record["id"]),
            next=int(record["next"]),
            runner=runner,
            resumed_by=[*record["resumed_by"], runner],
            started_wall=started_wall,
        )


def _move_json(move: Move) -> dict[str, Any]:
    return {"vhost": move.vhost, "queue": move.queue, "partition": move.partition,
            "from": move.source, "to": move.target, "weight": move.weight}  # fmt: skip


# Called with the job after each move; False: the job is no longer this gateway's (another
# took it over), so it stops here.
Progress = Callable[["MoveJob"], Awaitable[bool]]


async def _keep(job: MoveJob) -> bool:
    return True


async def run_job(job: MoveJob, hosts: Callable[[str], VirtualHost | None],
                  keeper: RouteKeeper, progress: Progress = _keep) -> None:  # fmt: skip
    """Carry the moves out in turn from ``job.next``; one that fails is noted and the job
    goes on."""
    gap = 60.0 / job.per_minute if job.per_minute > 0 else 0.0
    while job.next < len(job.moves):
        move = job.moves[job.next]
        job.current = move
        began = time.monotonic()
        try:
            await _move(move, hosts, keeper)
            job.done += 1
            log.info("%s: moved queue %r partition %d from %s to %s (%d/%d)", job.kind,
                     move.queue, move.partition, move.source, move.target, job.next + 1,
                     len(job.moves))  # fmt: skip
        except (RouteRefused, RouteConflict, MetaError, StoreError, TimeoutError) as error:
            job.failed.append(f"{move.queue} partition {move.partition}: {error}")
            log.warning("%s: queue %r partition %d not moved: %s", job.kind, move.queue,
                        move.partition, error)  # fmt: skip
        job.next += 1
        if job.next < len(job.moves):
            if not await progress(job):
                log.warning("%s: taken over by another gateway; stopping here", job.kind)
                return
            await anyio.sleep(max(0.0, gap - (time.monotonic() - began)))
    job.current = None
    job.finished = time.monotonic()
    await progress(job)
    log.info("%s: %d of %d partition(s) moved in %.1f s, %d failed", job.kind, job.done,
             len(job.moves), job.finished - job.started, len(job.failed))  # fmt: skip


async def _move(move: Move, hosts: Callable[[str], VirtualHost | None],
                keeper: RouteKeeper) -> None:  # fmt: skip
    host = hosts(move.vhost)
    queue = None if host is None else host.queues.get(move.queue)
    if host is None or queue is None or queue.deleted:
        raise RouteRefused("the queue is gone")
    if _made(host, queue, move):
        log.info("queue %r partition %d: moved already; waiting for it to settle", move.queue,
                 move.partition)  # fmt: skip
    else:
        await _ask(host, queue, move, keeper)
    keeper.poke()
    with anyio.fail_after(MOVE_TIMEOUT_S):
        while not settled(queue, keeper) and not queue.deleted:
            await anyio.sleep(POLL_S)


def _made(host: VirtualHost, queue: QueueRuntime, move: Move) -> bool:
    """Whether ``move`` was asked already: its partition is no longer open on its source."""
    groups = host.placement(queue.queue_id) if host.placement is not None else None
    on_source = groups is not None and move.partition < len(groups) and (
        groups[move.partition] == move.source)  # fmt: skip
    return not (on_source and _counted(queue, move.partition))


async def _ask(host: VirtualHost, queue: QueueRuntime, move: Move, keeper: RouteKeeper) -> None:
    for attempt in range(3):
        try:
            if isinstance(queue, OrderedRuntime):
                await apply_step(host, queue, Step("move", move.partition, group=move.target))
            else:
                await elastic.move_partitions(host, queue, [move.partition], move.target)
            return
        except RouteConflict:  # another gateway's keeper wrote the route meanwhile
            if attempt == 2:
                raise
            await keyed_routes.follow(host, queue)
