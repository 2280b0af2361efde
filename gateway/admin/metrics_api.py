"""Prometheus: ``/metrics`` (node totals) and ``/metrics/per-object`` (also one series per
queue), with the ``rabbitmq_prometheus`` plugin's names where the meaning matches, so the
RabbitMQ-Overview Grafana dashboard reads a gateway, and ``mqgw_`` series for what only the
log design has (store latency, scheduler turns, lag, retention, controls).

Nothing is counted per message for this: a scrape copies the node's counters and the queues'
fields into plain tuples, then a custom ``Collector`` turns that copy into the exposition
format. Both steps run on the event loop in slices (``SNAPSHOT_YIELD_EVERY`` queues,
``FORMAT_CHUNK`` samples) with a turn for deliveries between them: a worker thread would hold
the GIL for 5 ms slices and make every socket operation of the loop wait for it.
Needs the ``monitoring`` tag (basic auth from the scraper).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gateway.admin.auth import MONITORING, requires
from gateway.admin.overview_api import RABBITMQ_API_VERSION
from gateway.admin.paths import SlashRoute
from gateway.admin.queues_api import head_age_s
from gateway.observe.histogram import Histogram
from gateway.observe.stats import QueueCounts, queue_counts
from gateway.resources import memory
from meta.models import User
from storage import StoreError

if TYPE_CHECKING:
    from gateway.node import Node
    from gateway.queues.runtime import QueueRuntime

SNAPSHOT_YIELD_EVERY = 500
NODE_COUNTERS = ("appended_records", "flow_holds_local", "flow_holds_remote")
FORMAT_CHUNK = 400  # per-queue samples rendered between event-loop turns (~2 ms)
PROTOCOL = {"protocol": "amqp091"}
# (name after rabbitmq_global_messages_, help, the NodeStats counters it sums)
GLOBAL_COUNTERS = (
    ("received", "AMQP messages received from publishers", ("publish",)),
    ("received_confirm", "Of those, on a channel in confirm mode", ("publish_confirm",)),
    ("confirmed", "Messages confirmed to publishers", ("confirm",)),
    ("unroutable_dropped", "Unroutable messages dropped", ("drop_unroutable",)),
    ("unroutable_returned", "Unroutable messages returned", ("return_unroutable",)),
    ("delivered", "Messages delivered (consume and get)",
     ("deliver", "deliver_no_ack", "get", "get_no_ack")),
    ("delivered_consume_manual_ack", "Delivered to consumers that ack", ("deliver",)),
    ("delivered_consume_auto_ack", "Delivered to no-ack consumers", ("deliver_no_ack",)),
    ("delivered_get_manual_ack", "Fetched with basic.get, manual ack", ("get",)),
    ("delivered_get_auto_ack", "Fetched with basic.get, no ack", ("get_no_ack",)),
    ("get_empty", "basic.get that found no message", ("get_empty",)),
    ("redelivered", "Messages redelivered", ("redeliver",)),
    ("acknowledged", "Messages acknowledged by consumers", ("ack",)),
)  # fmt: skip
# Per-queue fields of the snapshot, in order.
QUEUE_FIELDS = ("ready", "unacked", "consumers", "published", "delivered", "acked", "ready_bytes",
                "retention_dropped", "held_bytes", "lag_s", "stopped", "messages",
                "breaker_tripped", "breaker_trips", "breaker_tripped_s")  # fmt: skip
HELD_BYTES = QUEUE_FIELDS.index("held_bytes")


@dataclass
class Snapshot:
    """What a scrape reports, copied from the node in one pass."""

    node: str
    counters: dict[str, int]
    histograms: dict[str, Histogram]
    gauges: dict[str, float]
    alarms: dict[str, bool]
    controls: dict[str, int]
    queues: list[tuple[str, str, tuple[float, ...]]] = field(default_factory=list)


def _copy(histogram: Histogram) -> Histogram:
    copy = Histogram(histogram.bounds)
    copy.counts, copy.count, copy.total = list(histogram.counts), histogram.count, histogram.total
    return copy


async def take_snapshot(node: Node, per_object: bool) -> Snapshot:
    stats = node.stats
    sessions = [s for s in list(node.sessions) if s.opened]
    store: Any = node.store
    committer = getattr(store, "committer", None)  # the embedded store's group commit
    gauges: dict[str, float] = {
        "connections": len(sessions),
        "channels": sum(len(s.channels) for s in sessions),
        "resident": memory.resident_bytes(),
        "memory_limit": node.memory_alarm.on_above,
        "disk_free": shutil.disk_usage(node.settings.data_dir).free,
        "disk_limit": node.settings.min_free_disk_bytes,
        "ready_set": node.scheduler.ready_count,
        "fsyncs": getattr(committer, "fsyncs", 0),
    }
    held: dict[int, int] = {}
    try:
        held = await node.store.held_back_bytes()
        gauges["store_disk"] = await node.store.disk_bytes()
        gauges["store_backlog"] = await node.store.backlog_bytes()
        gauges["store_held"] = sum(held.values())
    except StoreError:
        # Every broker group away: the store figures (the queues' held bytes too) are left
        # out, the rest is scraped.
        held = {}
    files = getattr(getattr(getattr(store, "log", None), "commit_log", None), "files", None)
    if files is not None:
        gauges["segments"] = len(files.segments)
    controls: dict[str, int] = {}
    for control in node.controls.all():
        kind = control.state or ("throttled" if control.rate_msgs or control.rate_bytes else "")
        if kind:
            controls[kind] = controls.get(kind, 0) + 1
    snapshot = Snapshot(
        node.name,
        {key: getattr(stats, key) for key in (*_counter_keys(), *NODE_COUNTERS)},
        {
            "append": _copy(stats.append_latency),
            "durable": _copy(stats.durable_wait),
            "turn": _copy(node.scheduler.turn_time),
        },
        gauges,
        {a.name: a.blocked for a in node.alarms.alarms},
        controls,
    )
    now_ms = time.time_ns() // 1_000_000
    totals = [0.0] * len(QUEUE_FIELDS)
    queues = 0
    consumers = 0
    scraped = list(node.all_queues())
    counts = await queue_counts(scraped)
    for index, queue in enumerate(scraped):
        row = _queue_row(queue, counts[queue.queue_id], held, now_ms)
        queues += 1
        consumers += len(queue.consumers)
        for i, value in enumerate(row):
            totals[i] += value
        if per_object:
            snapshot.queues.append((queue.definition.vhost, queue.name, row))
        if index % SNAPSHOT_YIELD_EVERY == SNAPSHOT_YIELD_EVERY - 1:
            await anyio.lowlevel.checkpoint()
    gauges.update(queues=queues, consumers=consumers)
    gauges.update({f"total_{name}": totals[i] for i, name in enumerate(QUEUE_FIELDS)})
    return snapshot


def _counter_keys() -> tuple[str, ...]:
    return tuple(dict.fromkeys(k for _, _, keys in GLOBAL_COUNTERS for k in keys))


def _queue_row(
    queue: QueueRuntime, counts: QueueCounts, held: dict[int, int], now_ms: int
) -> tuple[float, ...]:
    lag = head_age_s(queue, now_ms)
    return (
        counts.ready,
        counts.unacked,
        len(queue.consumers),
        queue.enqueued,
        queue.delivered,
        queue.acked,
        queue.ready_bytes,
        queue.dropped_by_retention,
        held.get(queue.queue_id, 0),
        0.0 if lag is None else lag,
        1.0 if queue.paused else 0.0,
        counts.messages,
        *_breaker_fields(queue),
    )


def _breaker_fields(queue: QueueRuntime) -> tuple[float, float, float]:
    breaker = queue.breaker
    if breaker is None:
        return 0.0, 0.0, 0.0
    tripped_s = breaker.time_tripped(queue.clock.monotonic())
    return float(breaker.tripped), float(breaker.trips), tripped_s


class SnapshotCollector(Collector):
    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        yield from _identity(s)
        yield from _globals(s)
        yield from _node_gauges(s)
        yield from _mqgw(s)


def _gauge(name: str, text: str, value: float, labels: dict[str, str] | None = None) -> Metric:
    family = GaugeMetricFamily(name, text, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


def _identity(s: Snapshot) -> Iterator[Metric]:
    labels = {"rabbitmq_node": s.node, "rabbitmq_cluster": s.node,
              "rabbitmq_cluster_permanent_id": f"mqgw-{s.node}"}  # fmt: skip
    yield _gauge("rabbitmq_identity_info", "RabbitMQ node & cluster identity info", 1, labels)
    build = {"rabbitmq_version": RABBITMQ_API_VERSION, "product": "mqgw"}
    yield _gauge("rabbitmq_build_info", "RabbitMQ & Erlang/OTP version info", 1, build)


def _globals(s: Snapshot) -> Iterator[Metric]:
    for suffix, text, keys in GLOBAL_COUNTERS:
        family = CounterMetricFamily(
            f"rabbitmq_global_messages_{suffix}", text, labels=list(PROTOCOL)
        )
        family.add_metric(list(PROTOCOL.values()), sum(s.counters[k] for k in keys))
        yield family
    routed = s.counters["publish"] - s.counters["drop_unroutable"]
    routed -= s.counters["return_unroutable"]
    family = CounterMetricFamily(
        "rabbitmq_global_messages_routed", "Messages routed to queues", labels=list(PROTOCOL)
    )
    family.add_metric(list(PROTOCOL.values()), routed)
    yield family
    yield _gauge("rabbitmq_global_consumers", "Current number of consumers", s.gauges["consumers"],
                 PROTOCOL)  # fmt: skip


def _node_gauges(s: Snapshot) -> Iterator[Metric]:
    g = s.gauges
    yield _gauge("rabbitmq_connections", "Connections currently open", g["connections"])
    yield _gauge("rabbitmq_channels", "Channels currently open", g["channels"])
    yield _gauge("rabbitmq_consumers", "Consumers currently connected", g["consumers"])
    yield _gauge("rabbitmq_queues", "Queues available", g["queues"])
    yield _gauge("rabbitmq_process_resident_memory_bytes", "Resident memory", g["resident"])
    yield _gauge("rabbitmq_resident_memory_limit_bytes", "Memory high watermark",
                 g["memory_limit"])  # fmt: skip
    yield _gauge("rabbitmq_disk_space_available_bytes", "Disk space available", g["disk_free"])
    yield _gauge("rabbitmq_disk_space_available_limit_bytes", "Free disk space low watermark",
                 g["disk_limit"])  # fmt: skip
    yield _gauge("rabbitmq_alarms_memory_used_watermark", "Memory alarm on (1)",
                 float(s.alarms.get("memory", False)))  # fmt: skip
    yield _gauge("rabbitmq_alarms_free_disk_space_watermark", "Disk alarm on (1)",
                 float(s.alarms.get("disk", False)))  # fmt: skip
    if not s.queues:  # the plugin's aggregated mode: queue sums without labels
        for name, index, text in (
            ("rabbitmq_queue_messages_ready", 0, "Messages ready to be delivered"),
            ("rabbitmq_queue_messages_unacked", 1, "Messages delivered, not yet acknowledged"),
            ("rabbitmq_queue_consumers", 2, "Consumers on queues"),
            ("rabbitmq_queue_messages_ready_bytes", 6, "Bytes of ready messages"),
        ):
            yield _gauge(name, text, g[f"total_{QUEUE_FIELDS[index]}"])
        messages = g["total_ready"] + g["total_unacked"]
        yield _gauge("rabbitmq_queue_messages", "Ready and unacknowledged messages", messages)
        yield _gauge("mqgw_queue_breakers_tripped", "Queues whose depth breaker is tripped",
                     g["total_breaker_tripped"])  # fmt: skip


def _histogram(name: str, text: str, histogram: Histogram) -> Metric:
    family = HistogramMetricFamily(name, text)
    family.add_metric([], histogram.cumulative(), histogram.total)
    return family


def _mqgw(s: Snapshot) -> Iterator[Metric]:
    g = s.gauges
    yield _histogram("mqgw_store_append_seconds", "store.append per publish batch",
                     s.histograms["append"])  # fmt: skip
    yield _histogram("mqgw_store_durable_wait_seconds", "Wait for durability (fsync) per "
                     "confirm batch", s.histograms["durable"])  # fmt: skip
    yield _histogram("mqgw_scheduler_turn_seconds", "One push-scheduler turn", s.histograms["turn"])
    appended = CounterMetricFamily("mqgw_store_records_appended", "Records appended by the gateway",
                                   value=s.counters["appended_records"])  # fmt: skip
    yield appended
    holds = CounterMetricFamily("mqgw_publisher_flow_holds", "Times a publishing connection "
                                "was held for a queue far behind", labels=["by"])  # fmt: skip
    holds.add_metric(["local"], s.counters["flow_holds_local"])
    holds.add_metric(["remote"], s.counters["flow_holds_remote"])  # the delivering gateway's
    yield holds
    text = "Commitlog fsyncs (embedded store); records per fsync = appended / fsyncs"
    yield CounterMetricFamily("mqgw_store_fsyncs", text, value=g["fsyncs"])
    yield _gauge("mqgw_scheduler_ready_queues", "Queues in the push scheduler's ready set",
                 g["ready_set"])  # fmt: skip
    if "store_disk" in g:
        yield _gauge("mqgw_store_disk_bytes", "Commitlog bytes on disk", g["store_disk"])
        yield _gauge("mqgw_store_backlog_bytes", "Bytes appended, not yet durable",
                     g["store_backlog"])  # fmt: skip
        yield _gauge("mqgw_store_held_back_bytes", "Commitlog bytes kept for unconsumed "
                     "messages", g["store_held"])  # fmt: skip
    if "segments" in g:
        yield _gauge("mqgw_store_segments", "Commitlog segment files", g["segments"])
    yield _gauge("mqgw_consumer_lag_messages", "Messages not yet consumed, all queues",
                 g["total_ready"] + g["total_unacked"])  # fmt: skip
    yield CounterMetricFamily("mqgw_retention_dropped_messages", "Unread messages the store's "
                              "retention removed (queues now present)",
                              value=g["total_retention_dropped"])  # fmt: skip
    controls = GaugeMetricFamily("mqgw_controls", "Consumption controls in force, by kind",
                                 labels=["state"])  # fmt: skip
    for state in ("stopped", "running", "throttled"):
        controls.add_metric([state], s.controls.get(state, 0))
    yield controls
    alarms = GaugeMetricFamily("mqgw_alarm", "Resource alarm on (1)", labels=["alarm"])
    for name, on in sorted(s.alarms.items()):
        alarms.add_metric([name], float(on))
    yield alarms


_PER_QUEUE = (
    (GaugeMetricFamily, "rabbitmq_queue_messages_ready", "Messages ready to be delivered", 0),
    (GaugeMetricFamily, "rabbitmq_queue_messages_unacked", "Messages delivered, not acked", 1),
    (GaugeMetricFamily, "rabbitmq_queue_consumers", "Consumers on the queue", 2),
    (CounterMetricFamily, "rabbitmq_queue_messages_published", "Messages published into it", 3),
    (CounterMetricFamily, "mqgw_queue_messages_delivered", "Deliveries and gets from it", 4),
    (CounterMetricFamily, "mqgw_queue_messages_acked", "Messages acknowledged", 5),
    (GaugeMetricFamily, "rabbitmq_queue_messages_ready_bytes", "Bytes of ready messages", 6),
    (CounterMetricFamily, "mqgw_queue_retention_dropped_messages", "Lost to retention", 7),
    (GaugeMetricFamily, "mqgw_queue_held_back_bytes", "Commitlog bytes it keeps", 8),
    (GaugeMetricFamily, "mqgw_queue_consumer_lag_seconds", "Age of its oldest ready "
     "message read into memory", 9),
    (GaugeMetricFamily, "mqgw_queue_paused", "Consumption stopped by a control (1)", 10),
    (GaugeMetricFamily, "rabbitmq_queue_messages", "Ready and unacknowledged messages", 11),
    (GaugeMetricFamily, "mqgw_queue_consumer_lag_messages", "Messages not yet consumed", 11),
    (GaugeMetricFamily, "mqgw_queue_breaker_tripped", "Depth breaker tripped (1)", 12),
    (CounterMetricFamily, "mqgw_queue_breaker_trips", "Times its depth breaker tripped", 13),
    (CounterMetricFamily, "mqgw_queue_breaker_tripped_seconds", "Time its depth breaker "
     "spent tripped", 14),
)  # fmt: skip


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def _render(collector: Collector) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)


async def exposition(snapshot: Snapshot) -> bytes:
    """The node's families, then each per-queue family rendered FORMAT_CHUNK queues at a
    time (its HELP/TYPE lines kept from the first chunk only), yielding between chunks."""
    parts = [_render(SnapshotCollector(snapshot))]
    rows = snapshot.queues
    for kind, name, text, index in _PER_QUEUE if rows else ():
        if index == HELD_BYTES and "store_held" not in snapshot.gauges:
            continue  # the store was away: no figure rather than 0
        for start in range(0, len(rows), FORMAT_CHUNK):
            family = kind(name, text, labels=["vhost", "queue"])
            for vhost, queue, row in rows[start : start + FORMAT_CHUNK]:
                family.add_metric([vhost, queue], row[index])
            rendered = _render(_Families([family]))
            parts.append(rendered if start == 0 else rendered.split(b"\n", 2)[2])
            await anyio.lowlevel.checkpoint()
    return b"".join(parts)


def routes(node: Node) -> APIRouter:
    router = APIRouter(route_class=SlashRoute)
    monitoring = Depends(requires(MONITORING, node))

    async def scrape(per_object: bool) -> Response:
        snapshot = await take_snapshot(node, per_object)
        body = await exposition(snapshot)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @router.get("/metrics", summary="Prometheus: node totals (rabbitmq_prometheus names)")
    async def metrics(_user: User = monitoring) -> Response:
        return await scrape(per_object=False)

    @router.get("/metrics/per-object", summary="Prometheus: also one series per queue")
    async def per_object(_user: User = monitoring) -> Response:
        return await scrape(per_object=True)

    return router
