"""Order keys onto Spark tasks: each key in exactly one task, tasks balanced by message count.

Hashing keys onto tasks leaves them uneven when there are few keys (8 keys on 2 tasks put 7 on
one). Instead the driver counts each key's messages and assigns keys largest first, each to the
task with the fewest messages so far (greedy; within 4/3 of the best split). A task is a Spark
partition: ``repartition(n, col)`` places a row by ``pmod(hash(col), n)``, so each task gets a
salt, a number whose hash lands on that task, and every row of a key carries its task's salt.
With very many keys hashing is already even: above ``BALANCE_MAX_KEYS`` the keys are hashed.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

BALANCE_MAX_KEYS = 100_000  # the key counts are collected to the driver below this
SEND_COLUMNS = (
    "capture_id",
    "seq",
    "ts_ms",
    "sched_ms",
    "order_key",
    "key_seq",
    "connection",
    "channel",
    "exchange",
    "routing_key",
    "properties_raw",
    "body",
)


def balance_keys(counts: Iterable[tuple[str, int]], buckets: int) -> dict[str, int]:
    """key -> bucket in ``range(buckets)``: largest key first into the lightest bucket."""
    loads = [(0, bucket) for bucket in range(max(1, buckets))]
    assignment: dict[str, int] = {}
    for key, count in sorted(counts, key=lambda kc: (-kc[1], kc[0])):
        load, bucket = heapq.heappop(loads)
        assignment[key] = bucket
        heapq.heappush(loads, (load + count, bucket))
    return assignment


def partition_salts(spark: SparkSession, partitions: int) -> list[int]:
    """For each partition p, a long whose ``repartition(partitions, col)`` target is p."""
    found: dict[int, int] = {}
    start, width = 0, 64 * partitions  # each p is missed by 64n candidates with odds ~e^-64
    while len(found) < partitions:
        candidates = spark.range(start, start + width).select(
            "id", sf.pmod(sf.hash("id"), sf.lit(partitions)).alias("p")
        )
        for row in candidates.groupBy("p").agg(sf.min("id").alias("id")).collect():
            found.setdefault(int(row["p"]), int(row["id"]))
        start += width
    return [found[p] for p in range(partitions)]


def spread_keys(spark: SparkSession, planned: DataFrame, tasks: int, keys: int) -> DataFrame:
    """``planned`` in ``tasks`` partitions, each key in one of them, sorted by schedule time."""
    if keys > BALANCE_MAX_KEYS or tasks == 1:
        spread = planned.repartition(tasks, "order_key")
    else:
        counts = planned.groupBy("order_key").count().collect()
        assignment = balance_keys(((r["order_key"], int(r["count"])) for r in counts), tasks)
        salts = partition_salts(spark, tasks)
        table = spark.createDataFrame(
            [(key, salts[bucket]) for key, bucket in assignment.items()],
            "order_key string, salt long",
        )
        # A left join: a key the table lacks (none should) still lands in one partition.
        spread = (
            planned.join(sf.broadcast(table), "order_key", "left")
            .repartition(tasks, "salt")
            .drop("salt")
        )
    return spread.sortWithinPartitions("sched_ms", "seq")
