"""`mqgw replay reconcile`: what arrived in the target's log against what the capture routed.

Arrivals are the target's records (the ``mqgw-log`` source over its data dir) carrying this
capture's ``x-mqgw-replay`` header; redeliveries and dead letters are re-appends of a message
already counted, so they are left out. Expected queues are the capture's ``routed_queues``
(for a default-exchange publish RabbitMQ's tracer lists the routing key even when no such
queue exists: a name the target lacks there counts as unroutable). Where the capture names
no queues, any queue is accepted and the message is missing only if it arrived nowhere.

The target is an embedded node's data dir or a `mqgw cluster` dir (every broker group's log;
queue names from its metadata on Redis). A cluster's groups number their offsets apart, so
order is checked within each group's log: a queue partition lives on one group, and a queue's
partitions on different groups have no order between them (as on RabbitMQ, per queue only).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as sf

from replay.amqp_props import REPLAY_HEADER
from replay.log_reader import QueueNames, log_stores, names_to_json, target_queue_names
from replay.report_html import render_html
from replay.run import malformed_rows, plan_messages
from replay.spark import load_capture
from replay.stats import distribution, rate_series

FIRST = 20  # discrepancies of each kind listed in the report
ORDER_COLUMNS = (  # an order violation as listed in the report
    ["queue", "order_key", "capture_id", "key_seq", "after_seq", "broker_group", "offset"]
)


@dataclass
class ReconcileOptions:
    capture: Path
    fmt: str
    store: Path  # the target gateway's data dir, or a `mqgw cluster` dir (holding cluster.json)
    out: Path
    results: Path | None = None  # the run's output dir (default: ``out``)
    order_key: str | None = None  # default: the run's, else "channel"
    from_ms: int | None = None
    to_ms: int | None = None


def _run_document(options: ReconcileOptions) -> dict[str, Any]:
    path = (options.results or options.out) / "run.json"
    return dict(json.loads(path.read_text())) if path.is_file() else {}


def arrivals(
    spark: SparkSession, store: Path, capture_name: str, names: QueueNames | None = None
) -> DataFrame:
    """The target's records of this capture: one row per (record, queue)."""
    header = f"$['{REPLAY_HEADER}']"
    reader = spark.read.format("mqgw-log")
    if names is not None:  # looked up once by the caller (a cluster's: on Redis)
        reader = reader.option("names", names_to_json(names))
    log = reader.load(str(store))
    return (
        log.filter(~sf.col("redelivered"))
        .withColumn("headers", sf.col("properties.headers"))
        .filter(sf.get_json_object("headers", header).isNotNull())
        .filter(sf.get_json_object("headers", "$['x-death']").isNull())
        .filter(sf.get_json_object("headers", header + ".capture") == capture_name)
        .select(
            sf.get_json_object("headers", header + ".id").alias("capture_id"),
            "offset",
            "broker_group",
            "store_ts_ms",
            sf.explode_outer("queues").alias("queue"),
            sf.col("body").alias("arrived_body"),
            sf.col("properties").alias("arrived_properties"),
        )
    )


def expected_routes(
    planned: DataFrame, target_queues: set[str], arrived: DataFrame, unlisted: int
) -> DataFrame:
    """(capture_id, queue) for every queue the capture says a message reached; ``unlisted``:
    how many messages have no ``routed_queues`` (any queue they reached is accepted)."""
    known = sf.array(*[sf.lit(q) for q in sorted(target_queues)]) if target_queues else None
    routed = sf.col("routed_queues")
    if known is not None:  # the tracer's default-exchange echo of a missing queue
        routed = sf.when(
            sf.col("exchange") == "", sf.filter(routed, lambda q: sf.array_contains(known, q))
        ).otherwise(routed)
    listed = planned.filter(sf.col("routed_queues").isNotNull()).select(
        "capture_id", sf.explode(sf.array_distinct(routed)).alias("queue")
    )  # capture ids are unique: these pairs are distinct without a shuffle
    if not unlisted:
        return listed
    unknown = planned.filter(sf.col("routed_queues").isNull()).select("capture_id")
    seen = arrived.select("capture_id", "queue").distinct()
    accepted = unknown.join(seen, "capture_id", "left")
    return listed.unionByName(
        accepted.select("capture_id", sf.coalesce("queue", sf.lit("(anywhere)")).alias("queue"))
    )


def reconcile(spark: SparkSession, options: ReconcileOptions) -> dict[str, Any]:
    started = time.monotonic()
    run = _run_document(options)
    order_key, from_ms, to_ms = _run_settings(options, run.get("options", {}))
    capture = load_capture(spark, options.capture, options.fmt, from_ms, to_ms).cache()
    planned = plan_messages(capture, order_key).cache()
    names = target_queue_names(options.store)
    groups = [s.group for s in log_stores(options.store) if s.group]
    arrived = arrivals(spark, options.store, options.capture.name, names).cache()
    counts = planned.agg(
        sf.count("*").alias("messages"),
        sf.countDistinct("order_key").alias("keys"),
        sf.count_if(sf.col("routed_queues").isNull()).alias("unlisted"),
    ).first()
    assert counts is not None
    malformed = capture.filter(sf.col("error").isNotNull()).count()
    target_queues = {q.name for q in names.values()}
    expected = expected_routes(planned, target_queues, arrived, int(counts["unlisted"]))

    matched = _matched(expected, arrived)
    queues, totals = _per_queue(matched)
    violations, order = _order_check(matched, planned, order_key, int(counts["keys"]))

    content = _content_mismatches(planned, arrived)
    results = _results(spark, options.results or options.out)
    latency = _latency(arrived, results)
    if results is not None:
        results = results.cache()
    report: dict[str, Any] = {
        "capture": {
            "path": str(options.capture),
            "format": options.fmt,
            "messages": int(counts["messages"]),
            "malformed": malformed,
        },
        "target": {
            "store": str(options.store),
            "broker_groups": groups,
            "replayed_records": arrived.select("broker_group", "offset").distinct().count(),
        },
        "totals": {**totals, "order_violations": order["violations"], **content["counts"]},
        "queues": dict(sorted(queues.items())),
        "order": order,
        "latency_ms": distribution(latency, "latency_ms") if latency is not None else None,
        "pacing_error_ms": distribution(results, "lag_ms") if results is not None else None,
        "sends": _outcomes(results),
        "rates": rate_series(planned, results, run.get("plan") or {}),
        "discrepancies": {
            **_discrepancies(matched, violations, totals, order["violations"]),
            **content["first"],
            "malformed_lines": malformed_rows(capture, FIRST) if malformed else [],
        },
    }
    ok = not (totals["missing"] or totals["misrouted"] or order["violations"])
    report["ok"] = ok
    report["seconds"] = round(time.monotonic() - started, 3)
    for frame in (capture, planned, arrived, matched, violations, results):
        if frame is not None:
            frame.unpersist()
    _write_report(options.out, report)
    return report


def _run_settings(
    options: ReconcileOptions, run_options: dict[str, Any]
) -> tuple[str, int | None, int | None]:
    """The order key and capture window: as given, else the run's, else every message by
    channel."""
    order_key = options.order_key or run_options.get("order_key") or "channel"
    from_ms = options.from_ms if options.from_ms is not None else run_options.get("from_ms")
    to_ms = options.to_ms if options.to_ms is not None else run_options.get("to_ms")
    return order_key, from_ms, to_ms


def _matched(expected: DataFrame, arrived: DataFrame) -> DataFrame:
    """Each expected or arrived (capture_id, queue): its copies, its first copy's place, and
    its kind (arrived, missing or misrouted); cached."""
    copies = arrived.groupBy("capture_id", "queue").agg(
        sf.count("*").alias("copies"),
        sf.min_by("broker_group", "offset").alias("broker_group"),
        sf.min("offset").alias("offset"),
    )
    matched = expected.withColumn("expected", sf.lit(True)).join(
        copies, ["capture_id", "queue"], "full_outer"
    )
    return matched.withColumn(
        "kind",
        sf.when(sf.col("expected").isNull(), "misrouted")
        .when(sf.col("copies").isNull(), "missing")
        .otherwise("arrived"),
    ).cache()


def _per_queue(matched: DataFrame) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """The counts of each queue, and their totals."""
    per_queue = (
        matched.groupBy("queue")
        .agg(
            sf.sum(sf.col("expected").isNotNull().cast("long")).alias("expected"),
            sf.sum((sf.col("kind") == "arrived").cast("long")).alias("arrived"),
            sf.sum((sf.col("kind") == "missing").cast("long")).alias("missing"),
            sf.sum((sf.col("copies") > 1).cast("long")).alias("duplicated"),
            sf.sum((sf.col("kind") == "misrouted").cast("long")).alias("misrouted"),
        )
        .collect()
    )
    queues = {
        str(r["queue"]): {k: int(r[k] or 0) for k in r.asDict() if k != "queue"} for r in per_queue
    }
    totals = {
        k: sum(q[k] for q in queues.values())
        for k in ("expected", "arrived", "missing", "duplicated", "misrouted")
    }
    return queues, totals


def _order_check(
    matched: DataFrame, planned: DataFrame, order_key: str, keys: int
) -> tuple[DataFrame, dict[str, Any]]:
    """First arrivals stored after a later message of their key, in the same queue and
    broker group's log (cached), and the report's ``order`` section."""
    first_arrivals = matched.filter(sf.col("kind") == "arrived").join(
        planned.select("capture_id", "order_key", "key_seq"), "capture_id"
    )
    earlier = Window.partitionBy("queue", "order_key", "broker_group").orderBy("offset")
    before = earlier.rowsBetween(Window.unboundedPreceding, -1)
    ordered = first_arrivals.withColumn("after_seq", sf.max("key_seq").over(before))
    violations = ordered.filter(sf.col("key_seq") < sf.col("after_seq")).cache()
    violated = violations.agg(
        sf.count("*").alias("n"), sf.countDistinct("queue", "order_key").alias("keys")
    ).first()
    assert violated is not None
    order = {
        "order_key": order_key,
        "keys": keys,
        "violations": int(violated["n"]),
        "keys_with_violations": int(violated["keys"]),
    }
    return violations, order


def _discrepancies(
    matched: DataFrame, violations: DataFrame, totals: dict[str, int], violation_count: int
) -> dict[str, list[dict[str, Any]]]:
    """The first missing, duplicated, misrouted and out-of-order messages."""
    return {
        "missing": _first(
            matched.filter(sf.col("kind") == "missing"),
            ["capture_id", "queue"],
            count=totals["missing"],
        ),
        "duplicated": _first(
            matched.filter(sf.col("copies") > 1),
            ["capture_id", "queue", "copies"],
            count=totals["duplicated"],
        ),
        "misrouted": _first(
            matched.filter(sf.col("kind") == "misrouted"),
            ["capture_id", "queue", "broker_group", "offset"],
            count=totals["misrouted"],
        ),
        "out_of_order": _first(
            violations,
            ORDER_COLUMNS,
            "offset",
            violation_count,
        ),
    }


def _write_report(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    (out / "report.html").write_text(render_html(report), encoding="utf-8")


def _first(
    frame: DataFrame, columns: list[str], order: str = "capture_id", count: int | None = None
) -> list[dict[str, Any]]:
    """The first ``FIRST`` rows (no Spark job when ``count`` says there are none)."""
    if count == 0:
        return []
    return [r.asDict() for r in frame.select(*columns).orderBy(order).limit(FIRST).collect()]


def _without_replay_header(properties: str) -> Any:
    """The decoded properties struct with the provenance header left out of its headers
    (built-in functions: a JSON map of variants keeps every value's type); no headers: null."""
    parsed = sf.from_json(sf.col(properties).getField("headers"), "map<string,variant>")
    kept = sf.map_filter(parsed, lambda name, _: name != sf.lit(REPLAY_HEADER))
    return sf.col(properties).withField("headers", sf.when(sf.size(kept) > 0, sf.to_json(kept)))


def _content_mismatches(planned: DataFrame, arrived: DataFrame) -> dict[str, Any]:
    """Body and property differences of each message's first arrival (any queue)."""
    once = Window.partitionBy("capture_id").orderBy("offset")
    first = arrived.withColumn("n", sf.row_number().over(once)).filter(sf.col("n") == 1)
    pairs = first.join(planned.select("capture_id", "body", "properties"), "capture_id")
    checked = pairs.select(
        "capture_id",
        "offset",
        (~sf.col("body").eqNullSafe(sf.col("arrived_body"))).alias("body_differs"),
        (
            ~_without_replay_header("properties").eqNullSafe(
                _without_replay_header("arrived_properties")
            )
        ).alias("properties_differ"),
    ).cache()
    differing = checked.agg(
        sf.count_if("body_differs").alias("body"), sf.count_if("properties_differ").alias("props")
    ).first()
    assert differing is not None
    body, props = checked.filter("body_differs"), checked.filter("properties_differ")
    result = {
        "counts": {
            "body_mismatches": int(differing["body"]),
            "property_mismatches": int(differing["props"]),
        },
        "first": {
            "body_mismatch": _first(body, ["capture_id", "offset"], count=int(differing["body"])),
            "property_mismatch": _first(
                props, ["capture_id", "offset"], count=int(differing["props"])
            ),
        },
    }
    checked.unpersist()
    return result


def _results(spark: SparkSession, run_dir: Path) -> DataFrame | None:
    path = run_dir / "results.parquet"
    if not any(path.glob("*.parquet")):
        return None
    frame = spark.read.parquet(str(path))
    # A resumed run may have sent a message again: its last attempt counts.
    last = Window.partitionBy("capture_id").orderBy(sf.col("sent_ms").desc())
    return frame.withColumn("n", sf.row_number().over(last)).filter(sf.col("n") == 1).drop("n")


def _latency(arrived: DataFrame, results: DataFrame | None) -> DataFrame | None:
    """Schedule to store, per arrival's first copy: the target's store time minus due time."""
    if results is None:
        return None
    first = arrived.groupBy("capture_id").agg(sf.min("store_ts_ms").alias("store_ts_ms"))
    return first.join(results.select("capture_id", "due_ms"), "capture_id").select(
        (sf.col("store_ts_ms") - sf.col("due_ms")).alias("latency_ms")
    )


def _outcomes(results: DataFrame | None) -> dict[str, int] | None:
    if results is None:
        return None
    return {
        str(r["outcome"]): int(r["n"])
        for r in results.groupBy("outcome").agg(sf.count("*").alias("n")).collect()
    }
