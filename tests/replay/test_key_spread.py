"""Order keys onto sender tasks: balanced by message count, one task per key, in Spark."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql import functions as sf

from replay.key_spread import balance_keys, partition_salts, spread_keys


def test_greedy_largest_first_balances_and_keeps_each_key_whole() -> None:
    counts = [(f"k{i}", n) for i, n in enumerate([500, 400, 300, 300, 200, 100, 100, 100])]
    assignment = balance_keys(counts, 2)
    assert set(assignment) == {k for k, _ in counts}
    loads = [sum(n for k, n in counts if assignment[k] == b) for b in (0, 1)]
    assert sorted(loads) == [1000, 1000]
    # 8 equal keys on 2 tasks: 4 and 4 (hashing had put 7 on one task)
    even = balance_keys([(f"publisher-{i}", 100) for i in range(8)], 2)
    assert sorted(list(even.values()).count(b) for b in (0, 1)) == [4, 4]
    assert set(balance_keys([("only", 5)], 3).values()) == {0}


def test_each_key_lands_whole_on_its_assigned_partition(spark: SparkSession) -> None:
    salts = partition_salts(spark, 5)
    probe = spark.createDataFrame([(s,) for s in salts], "salt long").repartition(5, "salt")
    placed = probe.select("salt", sf.spark_partition_id().alias("p")).collect()
    assert {r["salt"]: r["p"] for r in placed} == {s: p for p, s in enumerate(salts)}

    sizes = {"a": 50, "b": 40, "c": 30, "d": 30, "e": 20, "f": 10, "g": 10, "h": 10}
    rows = [
        (key, n, n * 10, n * 10)
        for key, size in sizes.items()
        for n in range(size)  # key_seq n, sched_ms and seq ascending within the key
    ]
    planned = spark.createDataFrame(rows, "order_key string, key_seq int, sched_ms long, seq long")
    spread = spread_keys(spark, planned, 2, len(sizes))
    parts = spread.withColumn("p", sf.spark_partition_id()).collect()
    assert len(parts) == sum(sizes.values())
    by_key: dict[str, set[int]] = {}
    per_part: dict[int, list[tuple[str, int]]] = {}
    for row in parts:
        by_key.setdefault(row["order_key"], set()).add(row["p"])
        per_part.setdefault(row["p"], []).append((row["order_key"], row["key_seq"]))
    assert all(len(p) == 1 for p in by_key.values())  # one task per key
    assert sorted(len(v) for v in per_part.values()) == [100, 100]  # 200 messages, even
    for part in per_part.values():  # each key in capture order within its task
        for key in sizes:
            seqs = [s for k, s in part if k == key]
            assert seqs == sorted(seqs)
