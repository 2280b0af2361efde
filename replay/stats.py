"""Small aggregate views for the report: distributions and rates over time (computed in
Spark, collected as a few hundred numbers at most)."""

from __future__ import annotations

import math
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as sf

HISTOGRAM_BINS = 40
MAX_RATE_POINTS = 500


def distribution(frame: DataFrame, column: str) -> dict[str, Any] | None:
    """count, mean, min, p50/p90/p99, max and a histogram of ``column``."""
    col = sf.col(column)
    frame = frame.select(column).cache()  # two passes (quantiles, then the histogram): one input
    try:
        return _distribution(frame, col)
    finally:
        frame.unpersist()


def _distribution(frame: DataFrame, col: Any) -> dict[str, Any] | None:
    stats = frame.agg(
        sf.count(col).alias("count"),
        sf.mean(col).alias("mean"),
        sf.min(col).alias("min"),
        sf.max(col).alias("max"),
        sf.percentile_approx(col, [0.5, 0.9, 0.99], 10_000).alias("q"),
    ).first()
    if stats is None or not stats["count"]:
        return None
    low, high = float(stats["min"]), float(stats["max"])
    width = (high - low) / HISTOGRAM_BINS or 1.0
    buckets = (
        frame.select(sf.least(sf.floor((col - low) / width), sf.lit(HISTOGRAM_BINS - 1)).alias("b"))
        .groupBy("b")
        .count()
        .collect()
    )
    counts = [0] * HISTOGRAM_BINS
    for row in buckets:
        if row["b"] is not None:
            counts[int(row["b"])] += int(row["count"])
    p50, p90, p99 = (float(x) for x in stats["q"])
    return {
        "count": int(stats["count"]),
        "mean": round(float(stats["mean"]), 3),
        "min": round(low, 3),
        "p50": round(p50, 3),
        "p90": round(p90, 3),
        "p99": round(p99, 3),
        "max": round(high, 3),
        "histogram": {"start": low, "width": width, "counts": counts},
    }


def rate_series(
    planned: DataFrame, results: DataFrame | None, plan: dict[str, Any]
) -> dict[str, Any]:
    """Messages per second over time: the capture (its clock divided by the replay speed,
    so both lines share an axis) and the replay (by send time), from their own starts."""
    speed = float(plan.get("speed") or 1.0)
    if math.isinf(speed):
        speed = 0.0  # an unbounded replay: the capture's time axis kept as it was
    span = planned.agg(sf.min("ts_ms").alias("t0"), sf.max("ts_ms").alias("t1")).first()
    sent = (
        results.agg(sf.min("sent_ms").alias("s0"), sf.max("sent_ms").alias("s1")).first()
        if results is not None
        else None
    )
    if span is None or span["t0"] is None:
        return {"bucket_s": 1.0, "captured": [], "replayed": []}
    captured_s = (span["t1"] - span["t0"]) / 1000 / (speed or 1.0)
    replayed_s = (sent["s1"] - sent["s0"]) / 1000 if sent is not None and sent["s0"] else 0.0
    bucket = max(1.0, math.ceil(max(captured_s, replayed_s) / MAX_RATE_POINTS))
    captured = _series(planned, (sf.col("ts_ms") - span["t0"]) / 1000 / (speed or 1.0), bucket)
    replayed = (
        _series(results, (sf.col("sent_ms") - sent["s0"]) / 1000, bucket)
        if results is not None and sent is not None and sent["s0"] is not None
        else []
    )
    return {"bucket_s": bucket, "captured": captured, "replayed": replayed}


def _series(frame: DataFrame, seconds: Any, bucket: float) -> list[float]:
    rows = frame.select(sf.floor(seconds / bucket).alias("b")).groupBy("b").count().collect()
    if not rows:
        return []
    size = int(max(r["b"] for r in rows)) + 1
    series = [0.0] * size
    for row in rows:
        series[int(row["b"])] = row["count"] / bucket
    return series
