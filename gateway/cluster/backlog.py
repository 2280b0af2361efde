"""Publish flow control across gateways.

On one node a publisher waits while a queue it feeds is far behind consumers that could take
messages (QueueRuntime.congested). In a cluster the queue may be delivered by another
gateway, whose counts this one never sees: without more, a publisher on gateway A fills a
queue that gateway B's consumers drain, and latency grows with the backlog (fanout-10 on two
gateways: p99 3.7 s). The two gateways meet only at the broker, so that is where the backlog
is read:

- The delivering gateway reports its position with its offset commits (DeliveryProgress:
  next offset handed out, ready messages behind it, consumers with credit), every
  ``REPORT_EVERY_S`` while a queue it delivers is behind, and every ``MOVED_EVERY`` ticks
  for the others whose position moved (``report_progress``: counts on other gateways stay
  that fresh), besides the ordinary commit each second. The broker keeps with each report
  the ready count it meant on arrival.
- A publishing gateway that does not deliver the queue reads the broker's queue stats
  (``RemoteBacklog``, cached for ``SAMPLE_TTL_S`` and shared by its sessions) and holds the
  publisher, as on one node, while the reported backlog is above FLOW_HIGH, consumers could
  take messages and the position moves. It lets go below FLOW_LOW, when the consumers stop
  taking (no credit, or no report moving within ``MOVING_WINDOW_S``: a stale report from a
  gateway gone must not hold anyone), or after the session's bounded wait. The backlog is
  the one each report meant when it arrived, not the end now against an older position:
  a gateway keeping up sends no frequent reports, and what was published since its last
  one is no backlog of its.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import anyio

from gateway.queues.intake import FLOW_HIGH, FLOW_LOW
from gateway.queues.runtime import QueueRuntime
from storage import StoreError, StorePort

REPORT_EVERY_S = 0.05
MOVED_EVERY = 6  # ticks: positions that moved are reported every 0.3 s
# Ticks: a queue with deliveries outstanding is reported every 2 s, moved or not. A broker
# keeps reports in memory only: one that failed over or restarted counts, until the next
# report, what is out with consumers as ready (nothing else differs without a report).
REFRESH_EVERY = 40
REPORT_MAX_QUEUES = 256  # per tick, in turn: 10,000 backlogged queues cost no flood of calls
SAMPLE_TTL_S = 0.02
MOVING_WINDOW_S = 0.5
# Samples kept at most for this many queues before those unread for SAMPLE_KEEP_S go (a
# gateway publishing to many short-lived queues, replies say, must not keep them all).
SAMPLES_KEPT = 1024
SAMPLE_KEEP_S = 10.0


async def report_progress(queues: Callable[[], Iterable[QueueRuntime]]) -> None:
    """The delivering side: refresh the progress report of each queue this gateway delivers
    while it is behind (what the others' publishers are held by), once more as it catches up
    (else its last report, still behind, would hold them until it goes stale), and now and
    then for the others whose position moved (fresh counts on other gateways)."""
    # queue id -> its cursors and ready count at its last report: a delivery from what it
    # holds in hand, or a requeue, moves no cursor but changes what the others count.
    reported: dict[int, tuple[tuple[int, ...], int]] = {}
    behind: set[int] = set()  # queues behind at the last tick
    tick = turn = 0
    while True:
        await anyio.sleep(REPORT_EVERY_S)
        tick += 1
        due = []
        now_behind = set()
        for queue in queues():
            if queue.leases is None or not any(queue.leases) or queue.deleted:
                continue
            queue_id = queue.queue_id
            if queue.ready_count > FLOW_LOW:
                now_behind.add(queue_id)
                due.append(queue)
            elif (
                queue_id in behind
                or (tick % MOVED_EVERY == 0 and reported.get(queue_id) != _position(queue))
                or (tick % REFRESH_EVERY == 0 and any(queue.inflight))
            ):
                due.append(queue)
        behind = now_behind
        if not due:
            continue
        start = turn % len(due)
        for queue in (due[start:] + due[:start])[:REPORT_MAX_QUEUES]:
            reported[queue.queue_id] = _position(queue)
            with contextlib.suppress(StoreError):  # its broker is away: the next tick tries
                await queue.report_progress()
        turn += REPORT_MAX_QUEUES
        if len(reported) > 2 * len(due) + 1024:  # queues gone or no longer delivered here
            reported = {q.queue_id: reported[q.queue_id] for q in due if q.queue_id in reported}


def _position(queue: QueueRuntime) -> tuple[tuple[int, ...], int]:
    return tuple(queue.cursors), queue.ready_count


@dataclass
class _Sample:
    at: float  # monotonic s
    backlog: int  # ready messages the reports meant, in the partitions someone reports on
    takers: int
    positions: tuple[int, ...]
    moved_at: float  # when the reported positions last changed (-inf: never seen)
    depth: int = 0  # the queue's ready messages by the broker (as x-max-length counts them)
    routed_here: int = 0  # the queue's ``enqueued`` here when read: what was routed since


class RemoteBacklog:
    """The publishing side: how far behind, by the broker, a queue another gateway delivers
    is, and the wait of a publisher that feeds it."""

    def __init__(self, store: StorePort, clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.clock = clock
        self._samples: dict[int, _Sample] = {}
        self._refreshing: dict[int, anyio.Event] = {}

    async def hold(self, queue: QueueRuntime, max_wait_s: float) -> bool:
        """Wait while ``queue`` is congested at its delivering gateway; True if it waited.
        Its broker away: no wait (nothing is delivered there either)."""
        try:
            if not self.congested(await self.sample(queue)):
                return False
            with anyio.move_on_after(max_wait_s):
                while True:
                    await anyio.sleep(SAMPLE_TTL_S)
                    sample = await self.sample(queue)
                    if sample.backlog <= FLOW_LOW or not self._draining(sample):
                        break
        except StoreError:
            return False
        return True

    def congested(self, sample: _Sample) -> bool:
        return sample.backlog > FLOW_HIGH and self._draining(sample)

    def _draining(self, sample: _Sample) -> bool:
        return sample.takers > 0 and self.clock() - sample.moved_at <= MOVING_WINDOW_S

    async def sample(self, queue: QueueRuntime) -> _Sample:
        """The queue's latest sample, read again from the broker when older than
        SAMPLE_TTL_S (one read at a time per queue, shared by every waiting session)."""
        queue_id = queue.queue_id
        last = self._samples.get(queue_id)
        if last is not None and self.clock() - last.at < SAMPLE_TTL_S:
            return last
        busy = self._refreshing.get(queue_id)
        if busy is not None:
            await busy.wait()
            return self._samples.get(queue_id) or await self.sample(queue)
        self._refreshing[queue_id] = done = anyio.Event()
        try:
            stats = await self.store.queue_stats(queue_id)
        finally:
            del self._refreshing[queue_id]
            done.set()
        reported = [p for p in stats.partitions if p.next_offset >= 0]
        positions = tuple(p.next_offset for p in reported)
        now = self.clock()
        moved_at = float("-inf") if last is None else last.moved_at
        if last is not None and positions != last.positions and last.positions:
            moved_at = now
        sample = _Sample(
            now,
            sum(p.reported_ready for p in reported),
            max((p.takers for p in reported), default=0),
            positions,
            moved_at,
            sum(p.ready for p in stats.partitions),
            queue.enqueued,
        )
        self._samples[queue_id] = sample
        if len(self._samples) > SAMPLES_KEPT:
            kept_from = now - SAMPLE_KEEP_S
            self._samples = {q: s for q, s in self._samples.items() if s.at >= kept_from}
        return sample
