"""The node's message counters and their rates, as RabbitMQ's management plugin shows them.

The AMQP paths add to plain int attributes (per batch where there is one, else per message):
no lock, no allocation, no call. Rates come from samples: the housekeeping task records the
node's counters about once a second (ten minutes kept) and every queue's counters every
``QUEUE_SAMPLE_S``; a ``*_details.rate`` is the increase over the last ``RATE_WINDOW_S`` of
samples divided by the seconds between them, as the plugin's ``rate`` over its sample interval.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio

from gateway.observe.histogram import Histogram
from storage import PartitionStats, StoreError

if TYPE_CHECKING:
    from gateway.queues.runtime import QueueRuntime

# RabbitMQ's message_stats keys; deliver_get is their sum over deliver/get (derived).
MESSAGE_STATS = (
    "publish",
    "confirm",
    "deliver",
    "deliver_no_ack",
    "get",
    "get_no_ack",
    "get_empty",
    "ack",
    "redeliver",
    "return_unroutable",
    "drop_unroutable",
)
DELIVER_GET = ("deliver", "deliver_no_ack", "get", "get_no_ack")
RATE_WINDOW_S = 5.0  # the management plugin's default collect_statistics_interval
QUEUE_SAMPLE_S = 5.0
HISTORY_SAMPLES = 600  # ~1 s apart: ten minutes of node history (msg_rates_age=600)
SAMPLE_YIELD_EVERY = 1000  # queues sampled between event-loop turns
BROKER_COUNTS_AT_ONCE = 64  # queue_stats calls in flight for the views (cluster)


class Sample(NamedTuple):
    at: float  # monotonic seconds
    wall_ms: int
    values: tuple[int, ...]  # in MESSAGE_STATS order


class QueueSample(NamedTuple):
    at: float
    published: int
    delivered: int
    acked: int
    messages: int
    ready: int
    unacked: int

    def traffic(self) -> tuple[int, int, int]:
        return self.published, self.delivered, self.acked

    def lengths(self) -> tuple[int, int, int]:
        return self.messages, self.ready, self.unacked


def queue_unacked(queue: QueueRuntime) -> int:
    """Delivered and not yet settled: the deliveries this node holds out, as its in-flight
    offsets say (less those held only until their dead letter is stored). Not derived from
    the queue's traffic counters: they start at 0 with the runtime, so after a restart (or,
    in a cluster, with another gateway's publishes and acks) the difference went negative."""
    held = sum(len(offsets) for offsets in queue.inflight) - queue.dead_letters.held
    return max(0, held)


class QueueCounts(NamedTuple):
    """A queue's lengths as the management views and /metrics give them."""

    ready: int
    unacked: int

    @property
    def messages(self) -> int:
        return self.ready + self.unacked


async def queue_counts(queues: Iterable[QueueRuntime]) -> dict[int, QueueCounts]:
    """Each queue's counts, by queue id. On the gateway that delivers the queue (embedded,
    or holding every partition's lease), its own exact ready count and what it holds out
    (``queue_unacked``); on any other, the broker's ready count, as queue.declare answers
    there (QueueRuntime.message_count), and as unacknowledged what the delivering gateway
    holds out by its progress reports (``held_out``): the same figures on every gateway, as
    RabbitMQ shows on every node. A gateway that does not
    deliver a queue counts in what it routes and never sees it leave: a gateway that only
    published showed all it ever routed as ready, and one that lost the queue to another
    (a restart, a failover) kept its last figure."""
    counts: dict[int, QueueCounts] = {}
    elsewhere: list[QueueRuntime] = []
    for index, queue in enumerate(queues):
        if queue.holds_all_leases() or queue.waiting_for_broker:
            counts[queue.queue_id] = QueueCounts(queue.ready_count, queue_unacked(queue))
        else:
            elsewhere.append(queue)
        if index % SAMPLE_YIELD_EVERY == SAMPLE_YIELD_EVERY - 1:
            await anyio.lowlevel.checkpoint()  # 10,000 queues: let deliveries run
    for start in range(0, len(elsewhere), BROKER_COUNTS_AT_ONCE):
        async with anyio.create_task_group() as tasks:
            for queue in elsewhere[start : start + BROKER_COUNTS_AT_ONCE]:
                tasks.start_soon(_count_at_broker, queue, counts)
    return counts


async def _count_at_broker(queue: QueueRuntime, counts: dict[int, QueueCounts]) -> None:
    try:
        stats = await queue.store.queue_stats(queue.queue_id)
    except StoreError:  # its broker group is away: what this gateway knew
        counts[queue.queue_id] = QueueCounts(queue.ready_count, queue_unacked(queue))
        return
    # Unreported partitions: the broker counts them all ready (nothing known out there).
    counted = queue.counted(stats.partitions)
    reported = [h for h in map(held_out, counted) if h is not None]
    unacked = sum(reported) if reported else queue_unacked(queue)
    counts[queue.queue_id] = QueueCounts(sum(p.ready for p in counted), unacked)


def held_out(partition: PartitionStats) -> int | None:
    """What the delivering gateway holds out of ``partition``, from its last progress report
    (None without one): between the committed offset (the lowest unsettled) and its read
    position, less what is back in its hands (ready_behind). Exact while acks come in
    order; a message acked above one still out is counted too until the lower one settles
    (the committed offset is the lowest unacknowledged), an over-count RabbitMQ has not."""
    if partition.next_offset < 0:
        return None
    low = partition.min_offset
    settled_below = max(partition.committed, low)
    return max(0, max(partition.next_offset, low) - settled_below - partition.ready_behind)


def _queue_sample(queue: QueueRuntime, now: float) -> QueueSample:
    unacked = queue_unacked(queue)
    ready = queue.ready_count
    return QueueSample(
        now, queue.enqueued, queue.delivered, queue.acked, ready + unacked, ready, unacked
    )


def _rate(older: float, newer: float, seconds: float) -> float:
    return round((newer - older) / seconds, 1) if seconds > 0 else 0.0


def _rates(
    pair: tuple[QueueSample, QueueSample] | None,
    counters: Callable[[QueueSample], tuple[int, int, int]],
) -> tuple[float, float, float]:
    """Change per second of three ``counters`` between two samples (none yet: zeros)."""
    if pair is None:
        return 0.0, 0.0, 0.0
    old, new = pair
    seconds = new.at - old.at
    first, second, third = (
        _rate(older, newer, seconds)
        for older, newer in zip(counters(old), counters(new), strict=True)
    )
    return first, second, third


class NodeStats:
    """Counters since the node started (the AMQP side adds to them) and their history."""

    def __init__(self) -> None:
        self.started_wall_ms = time.time_ns() // 1_000_000
        self.publish = 0  # basic.publish received (rabbitmq_global_messages_received_total)
        self.publish_confirm = 0  # of those, on a channel in confirm mode
        self.confirm = 0  # publisher confirms (basic.ack) sent
        self.deliver = 0  # basic.deliver to consumers that ack
        self.deliver_no_ack = 0
        self.get = 0  # basic.get-ok, manual ack
        self.get_no_ack = 0
        self.get_empty = 0
        self.ack = 0  # basic.ack from consumers
        self.redeliver = 0
        self.return_unroutable = 0  # mandatory and routed nowhere: basic.return
        self.drop_unroutable = 0  # routed nowhere and dropped
        self.appended_records = 0  # records the gateway appended to the store
        # Publish flow control: a connection not read while a queue it feeds is behind,
        # by this gateway's own counts or (cluster) the delivering gateway's report.
        self.flow_holds_local = 0
        self.flow_holds_remote = 0
        self.append_latency = Histogram()  # store.append per publish batch
        self.durable_wait = Histogram()  # waiting for durability before a confirm (fsync)
        self.turn_time = Histogram()  # one push-scheduler turn (fill + pump)
        self.history: deque[Sample] = deque(maxlen=HISTORY_SAMPLES)
        self.queue_samples: dict[int, tuple[QueueSample, QueueSample]] = {}
        self.queue_totals: deque[QueueSample] = deque(maxlen=HISTORY_SAMPLES // 5)
        self._queues_sampled_at = -1e9

    def count_get(self, no_ack: bool, redelivered: bool) -> None:
        """A basic.get (or the HTTP API's get) handed out a message."""
        if no_ack:
            self.get_no_ack += 1
        else:
            self.get += 1
        self.redeliver += redelivered

    # -- sampling (the housekeeping task) -------------------------------------------------

    def values(self) -> tuple[int, ...]:
        return tuple(getattr(self, key) for key in MESSAGE_STATS)

    def sample(self, now: float | None = None) -> None:
        at = time.monotonic() if now is None else now
        self.history.append(Sample(at, time.time_ns() // 1_000_000, self.values()))

    def queues_due(self, now: float) -> bool:
        return now - self._queues_sampled_at >= QUEUE_SAMPLE_S

    async def sample_queues(self, queues: Iterable[QueueRuntime], now: float) -> None:
        """Every queue's counters and lengths (two samples kept per queue), and the totals."""
        self._queues_sampled_at = now
        previous = self.queue_samples
        current: dict[int, tuple[QueueSample, QueueSample]] = {}
        published = delivered = acked = messages = ready = unacked = 0
        for index, queue in enumerate(list(queues)):
            sample = _queue_sample(queue, now)
            before = previous.get(queue.queue_id)
            current[queue.queue_id] = (sample if before is None else before[1], sample)
            published += sample.published
            delivered += sample.delivered
            acked += sample.acked
            messages += sample.messages
            ready += sample.ready
            unacked += sample.unacked
            if index % SAMPLE_YIELD_EVERY == SAMPLE_YIELD_EVERY - 1:
                await anyio.lowlevel.checkpoint()  # 10,000 queues: let deliveries run
        self.queue_samples = current
        self.queue_totals.append(
            QueueSample(now, published, delivered, acked, messages, ready, unacked)
        )

    # -- reading --------------------------------------------------------------------------

    def _window(self) -> tuple[Sample, Sample] | None:
        """The newest sample and the one about RATE_WINDOW_S before it."""
        if len(self.history) < 2:
            return None
        newest = self.history[-1]
        older = self.history[-2]
        for sample in reversed(self.history):
            older = sample
            if newest.at - sample.at >= RATE_WINDOW_S:
                break
        return older, newest

    def rates(self) -> dict[str, float]:
        window = self._window()
        if window is None:
            return dict.fromkeys(MESSAGE_STATS, 0.0)
        older, newest = window
        seconds = newest.at - older.at
        return {
            key: _rate(a, b, seconds)
            for key, a, b in zip(MESSAGE_STATS, older.values, newest.values, strict=True)
        }

    def message_stats(self, age_s: int | None = None, incr_s: int | None = None) -> dict[str, Any]:
        """``message_stats`` of /api/overview; with ``msg_rates_age``/``msg_rates_incr``
        each ``*_details`` also carries RabbitMQ's ``samples``, ``avg`` and ``avg_rate``."""
        counts = dict(zip(MESSAGE_STATS, self.values(), strict=True))
        counts["deliver_get"] = sum(counts[k] for k in DELIVER_GET)
        rates = self.rates()
        rates["deliver_get"] = round(sum(rates[k] for k in DELIVER_GET), 1)
        result: dict[str, Any] = {}
        for key, count in counts.items():
            result[key] = count
            details: dict[str, Any] = {"rate": rates[key]}
            if age_s and incr_s:
                details.update(self._samples(key, age_s, incr_s))
            result[f"{key}_details"] = details
        return result

    def _samples(self, key: str, age_s: int, incr_s: int) -> dict[str, Any]:
        """One sample per ``incr_s`` over the last ``age_s`` seconds, newest first."""
        if not self.history:
            return {"samples": [], "avg": 0.0, "avg_rate": 0.0}
        newest = self.history[-1]
        keys = DELIVER_GET if key == "deliver_get" else (key,)
        indexes = [MESSAGE_STATS.index(k) for k in keys]
        picked: list[Sample] = []
        target = newest.at
        for sample in reversed(self.history):
            if newest.at - sample.at > age_s:
                break
            if sample.at <= target:
                picked.append(sample)
                target = sample.at - incr_s
        values = [sum(s.values[i] for i in indexes) for s in picked]
        span = picked[0].at - picked[-1].at
        return {
            "samples": [
                {"sample": v, "timestamp": s.wall_ms} for v, s in zip(values, picked, strict=True)
            ],
            "avg": round(sum(values) / len(values), 1),
            "avg_rate": _rate(values[-1], values[0], span),
        }

    def queue_rates(self, queue: QueueRuntime) -> tuple[float, float, float]:
        """(publish, deliver_get, ack) per second between the queue's last two samples."""
        return _rates(self.queue_samples.get(queue.queue_id), QueueSample.traffic)

    def queue_length_rates(self, queue: QueueRuntime) -> tuple[float, float, float]:
        """(messages, ready, unacked) change per second between the queue's last samples."""
        return _rates(self.queue_samples.get(queue.queue_id), QueueSample.lengths)

    def length_rates(self) -> tuple[float, float, float]:
        """(messages, ready, unacked) change per second over the node's queues."""
        totals = self.queue_totals
        return _rates((totals[-2], totals[-1]) if len(totals) >= 2 else None, QueueSample.lengths)


def queue_message_stats(stats: NodeStats, queue: QueueRuntime) -> dict[str, Any]:
    """A queue's ``message_stats`` (what its counters know: publish, deliver_get, ack)."""
    publish, deliver_get, ack = stats.queue_rates(queue)
    return {
        "publish": queue.enqueued,
        "publish_details": {"rate": publish},
        "deliver_get": queue.delivered,
        "deliver_get_details": {"rate": deliver_get},
        "ack": queue.acked,
        "ack_details": {"rate": ack},
    }
