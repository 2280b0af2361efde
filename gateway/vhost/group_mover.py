"""The gateway's runner of the cluster's one group move job (gateway/vhost/group_moves.py).

On a cluster the job is also a record in Redis (meta/move_jobs.py) with a lease held by the
gateway running it: it is one job for the whole cluster (any gateway answers 409 while it
runs, and shows it), its progress is written after every move, and when its gateway dies
another one takes the lapsed lease within ``LEASE_MS`` + ``WATCH_S`` and carries the job on
from the move it was at (a move asked twice is only waited for). The embedded node keeps the
job in memory only.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Protocol

import anyio

from gateway.vhost.group_moves import MoveJob, run_job
from gateway.vhost.host import VirtualHost
from gateway.vhost.rescale import RouteKeeper
from meta.errors import MetadataUnavailable

log = logging.getLogger("mqgw.rescale")

LEASE_MS = 3_000  # a job whose runner stopped renewing for this long is taken over
WATCH_S = 1.0  # how often the runner renews, and the others look for a job to take over


class JobRecords(Protocol):
    """The cluster's job record and its lease (meta/move_jobs.py ``SharedMoveJob``)."""

    owner: str

    async def claim(self) -> bool: ...
    async def save(self, record: str) -> bool: ...
    async def load(self) -> str | None: ...
    async def release(self) -> None: ...


class JobRunning(Exception):
    """Another move job runs (here or on another gateway)."""


class GroupMover:
    """Runs one move job at a time (``start``), in the node's task group (``run``)."""

    def __init__(self, hosts: Callable[[str], VirtualHost | None], keeper: RouteKeeper) -> None:
        self.hosts = hosts
        self.keeper = keeper
        self.job: MoveJob | None = None
        self.records: JobRecords | None = None  # set by the server on a cluster
        self._wake = anyio.Event()

    def busy(self) -> bool:
        return self.job is not None and self.job.finished is None

    async def shown(self) -> dict[str, Any] | None:
        """The job to show: this gateway's running one, else the cluster's record."""
        record = None if self.busy() or self.records is None else await self.records.load()
        if record is None:
            return None if self.job is None else self.job.view()
        shown: dict[str, Any] = json.loads(record)
        for private in ("next", "per_minute", "started_wall"):
            shown.pop(private, None)
        return shown

    async def start(self, job: MoveJob) -> None:
        """Run ``job``; JobRunning if one runs anywhere in the cluster (nothing started)."""
        if self.busy():
            raise JobRunning
        if self.records is not None:
            record = await self.records.load()
            if record is not None and json.loads(record).get("state") == "running":
                raise JobRunning
            if not await self.records.claim():
                raise JobRunning
            job.runner = self.records.owner
            await self.records.save(json.dumps(job.record()))
        self.job = job
        self._wake.set()

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            if self.records is not None:
                tg.start_soon(self._watch, self.records)
            while True:
                await self._wake.wait()
                self._wake = anyio.Event()
                job = self.job
                if job is not None and job.finished is None:
                    await run_job(job, self.hosts, self.keeper, self._progress)

    async def _progress(self, job: MoveJob) -> bool:
        if self.records is None:
            return True
        try:
            kept = await self.records.save(json.dumps(job.record()))
        except MetadataUnavailable as error:  # the next save says it; the lease may lapse
            log.warning("%s: progress not recorded (%s)", job.kind, error)
            return True
        if job.finished is not None or not kept:
            with suppress(MetadataUnavailable):
                await self.records.release()
        if not kept:
            job.finished = job.finished or time.monotonic()
        return kept

    async def _watch(self, records: JobRecords) -> None:
        """Renew the lease of the job running here; take over a job whose runner died."""
        while True:
            await anyio.sleep(WATCH_S)
            try:
                if self.busy():
                    await records.claim()
                else:
                    await self._take_over(records)
            except MetadataUnavailable as error:
                log.debug("move job: metadata store unreachable (%s)", error)

    async def _take_over(self, records: JobRecords) -> None:
        record = await records.load()
        if record is None:
            return
        found = json.loads(record)
        if found.get("state") != "running" or not await records.claim():
            return
        job = MoveJob.resumed(found, records.owner)
        log.warning("%s: resumed here from move %d of %d (gateway %s stopped running it)",
                    job.kind, job.next + 1, len(job.moves), found.get("gateway"))  # fmt: skip
        if not await records.save(json.dumps(job.record())):
            return
        self.job = job
        self._wake.set()
