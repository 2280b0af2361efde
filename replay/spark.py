"""The SparkSession the replay commands use, and loading a capture in any format.

``local[*]`` by default; ``--master spark://…`` (or `spark-submit`) for a cluster, whose
executors need this package installed (`pip install mqgw[replay]`) and, for `replay run`,
the output directory on a filesystem they share with the driver (senders write their
results there). A local session binds the driver to 127.0.0.1 and has no web UI.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

from replay.sources import FirehoseSource, MqgwLogSource, TraceSource

if TYPE_CHECKING:
    from pathlib import Path

FORMATS = ("rabbitmq-trace", "firehose", "mqgw-log")


def build_session(master: str | None = None, app: str = "mqgw-replay") -> SparkSession:
    # Workers must run this interpreter (the one with mqgw and pika installed).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app).master(master or "local[*]")
    if (master or "local").startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # every listener on loopback
        builder = (
            builder.config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.ui.enabled", "false")
        )
    spark = (
        builder.config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "8")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # per-connection chatter at INFO
    register_sources(spark)
    return spark


def register_sources(spark: SparkSession) -> None:
    for source in (TraceSource, FirehoseSource, MqgwLogSource):
        spark.dataSource.register(source)


def load_capture(
    spark: SparkSession,
    path: Path | str,
    fmt: str,
    from_ms: int | None = None,
    to_ms: int | None = None,
) -> DataFrame:
    """Every row of a capture (error rows included), in the capture columns, within the
    [from, to) window of original publish times."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown capture format {fmt!r}: one of {', '.join(FORMATS)}")
    reader = spark.read.format(fmt)
    if fmt == "mqgw-log":  # prune segments and records in the reader itself
        if from_ms is not None:
            reader = reader.option("from", str(from_ms))
        if to_ms is not None:
            reader = reader.option("to", str(to_ms))
    frame = reader.load(str(path))
    if from_ms is not None:
        frame = frame.filter(sf.col("error").isNotNull() | (sf.col("ts_ms") >= from_ms))
    if to_ms is not None:
        frame = frame.filter(sf.col("error").isNotNull() | (sf.col("ts_ms") < to_ms))
    return frame
