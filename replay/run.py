"""`mqgw replay run`: send a capture to a target, paced, each order key in capture order.

The driver reads the capture, drops what ``--resume`` finds confirmed already, derives each
message's order key, its number within the key and its schedule time (the key's running
maximum capture time, so pacing never reorders a key), and hands every key to exactly one
Spark task (replay.key_spread: balanced by message count), sorted by schedule time. Tasks
send (replay.sender) and write results; the driver shows progress from their progress files
and writes ``run.json``.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
from pyspark import InheritableThread
from pyspark.sql import DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as sf

from replay.key_spread import SEND_COLUMNS, spread_keys
from replay.pacing import share_of_rate
from replay.sender import RESULT_SCHEMA, SUMMARY_DDL, SendPlan, send_partition
from replay.spark import load_capture

_START_LEAD_S = 2.0  # time for tasks to start and connect before the first message is due


class TargetUnreachable(Exception):
    """The target refused or did not answer a connection: nothing was sent."""


@dataclass
class RunOptions:
    capture: Path
    fmt: str
    target: str
    out: Path
    speed: float = 1.0
    rate: float | None = None
    order_key: str = "channel"
    from_ms: int | None = None
    to_ms: int | None = None
    resume: bool = False
    senders: int | None = None  # default: the session's parallelism
    window: int = 1000  # unconfirmed publishes per sender


@dataclass
class RunSummary:
    messages: int = 0
    skipped_confirmed: int = 0
    malformed: list[dict[str, Any]] = field(default_factory=list)
    sent: int = 0
    confirmed: int = 0
    nacked: int = 0
    returned: int = 0
    errors: int = 0
    stopped: bool = False
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


def redact(url: str) -> str:
    parameters = pika.URLParameters(url)
    vhost = parameters.virtual_host
    return (
        f"amqp://{parameters.credentials.username}:***@{parameters.host}:{parameters.port}/{vhost}"
    )


def check_target(url: str, timeout_s: float = 5.0) -> None:
    """Connect once, quickly: a clear error now beats a failure in every Spark task."""
    try:
        parameters = pika.URLParameters(url)
    except Exception as error:  # pika raises ValueError/KeyError/... on a bad URL
        raise TargetUnreachable(f"bad target URL {url!r}: {error}") from None
    parameters.connection_attempts = 1
    parameters.socket_timeout = timeout_s
    parameters.stack_timeout = timeout_s
    try:
        pika.BlockingConnection(parameters).close()
    except pika.exceptions.AMQPError as error:
        reason = repr(error) if not str(error) else str(error)
        raise TargetUnreachable(f"cannot connect to target {redact(url)}: {reason}") from None


def missing_exchanges(url: str, names: list[str]) -> dict[str, str]:
    """The captured exchanges the target lacks, each with its passive declare's 404: their
    messages are recorded as errors instead of closing a channel full of confirms in flight."""
    missing: dict[str, str] = {}
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        for name in sorted(n for n in names if n):  # the default exchange always exists
            try:
                channel.exchange_declare(name, passive=True)
            except pika.exceptions.ChannelClosedByBroker as closed:
                missing[name] = f"channel closed: {closed.reply_code} {closed.reply_text}"
                channel = connection.channel()
    finally:
        if connection.is_open:
            connection.close()
    return missing


def order_key_column(spec: str) -> Any:
    """``channel`` (connection + channel, RabbitMQ's ordering unit), ``routing-key`` or
    ``header:NAME``."""
    if spec == "channel":
        return sf.concat_ws(
            "#",
            sf.coalesce("connection", sf.lit("")),
            sf.coalesce(sf.col("channel").cast("string"), sf.lit("")),
        )
    if spec == "routing-key":
        return sf.coalesce("routing_key", sf.lit(""))
    if spec.startswith("header:") and len(spec) > len("header:"):
        name = spec.split(":", 1)[1].replace("'", "\\'")
        return sf.coalesce(sf.get_json_object("properties.headers", f"$['{name}']"), sf.lit(""))
    raise ValueError(f"--order-key: channel, routing-key or header:NAME, not {spec!r}")


def malformed_rows(capture: DataFrame, limit: int = 1000) -> list[dict[str, Any]]:
    rows = capture.filter(sf.col("error").isNotNull()).select("source_file", "line", "error")
    return [r.asDict() for r in rows.orderBy("source_file", "line").limit(limit).collect()]


def plan_messages(capture: DataFrame, order_key: str) -> DataFrame:
    """Good rows with their order key, number within the key and schedule time."""
    by_key = Window.partitionBy("order_key").orderBy("seq")
    running = by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return (
        capture.filter(sf.col("error").isNull())
        .withColumn("order_key", order_key_column(order_key))
        .withColumn("key_seq", sf.row_number().over(by_key))
        .withColumn("sched_ms", sf.max("ts_ms").over(running))
    )


def confirmed_ids(spark: SparkSession, out: Path) -> DataFrame | None:
    results = out / "results.parquet"
    if not any(results.glob("*.parquet")):
        return None
    frame = spark.read.parquet(str(results))
    return frame.filter(sf.col("outcome") == "confirmed").select("capture_id").distinct()


def run_replay(
    spark: SparkSession,
    options: RunOptions,
    progress: Callable[[dict[str, Any]], None] | None = None,
    stop: threading.Event | None = None,
) -> RunSummary:
    """Replay ``options.capture``; ``stop`` set (Ctrl-C) ends it after the messages in flight."""
    check_target(options.target)
    out = options.out
    _prepare_out_dir(out, options.resume)
    summary = RunSummary()
    planned, stats = _plan_run(spark, options, summary)
    if summary.messages == 0:
        planned.unpersist()
        _write_run(out, options, summary, None)
        return summary
    senders = max(
        1, min(int(stats["keys"]), options.senders or spark.sparkContext.defaultParallelism)
    )
    missing = missing_exchanges(options.target, stats["exchanges"])
    ordered = spread_keys(spark, planned.select(*SEND_COLUMNS), senders, int(stats["keys"]))
    # Shuffled and sorted before the clock starts: senders begin on time, not after a stage.
    ordered = ordered.localCheckpoint(eager=True)
    planned.unpersist()
    plan = SendPlan(
        target=options.target,
        out_dir=str(out.resolve()),
        run_id=uuid.uuid4().hex[:12],
        capture_name=options.capture.name,
        start_s=time.time() + _START_LEAD_S,
        t0_ms=int(stats["t0"]),
        speed=options.speed,
        rate_per_sender=share_of_rate(options.rate, senders),
        window=options.window,
        missing_exchanges=tuple(sorted(missing.items())),
    )
    job = ordered.mapInArrow(lambda batches: send_partition(plan, batches), SUMMARY_DDL)
    started = time.monotonic()
    results, failure = _run_job(job, out, summary.messages, progress, stop)
    ordered.unpersist()
    if failure:
        raise failure[0]
    _add_results(summary, results)
    summary.seconds = time.monotonic() - started
    _write_run(out, options, summary, plan)
    return summary


def _prepare_out_dir(out: Path, resume: bool) -> None:
    """The output dir, without a previous run's progress files and stop request (and, unless
    resuming, without its results)."""
    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        shutil.rmtree(out / "results.parquet", ignore_errors=True)
    shutil.rmtree(out / "progress", ignore_errors=True)
    (out / "STOP").unlink(missing_ok=True)


def _plan_run(
    spark: SparkSession, options: RunOptions, summary: RunSummary
) -> tuple[DataFrame, Row]:
    """The messages to send (cached; without those a resumed run had confirmed) and their
    count, first schedule time, keys and exchanges; fills in the summary's messages,
    malformed lines and skipped messages."""
    capture = load_capture(spark, options.capture, options.fmt, options.from_ms, options.to_ms)
    capture = capture.cache()
    summary.malformed = malformed_rows(capture)
    planned = plan_messages(capture, options.order_key)
    done = confirmed_ids(spark, options.out) if options.resume else None
    if done is not None:
        planned = planned.join(done, "capture_id", "left_anti")
    planned = planned.cache()
    stats = planned.agg(
        sf.count("*").alias("n"),
        sf.min("sched_ms").alias("t0"),
        sf.countDistinct("order_key").alias("keys"),
        sf.collect_set("exchange").alias("exchanges"),
    ).first()
    assert stats is not None
    summary.messages = int(stats["n"])
    if done is not None:
        good = capture.filter(sf.col("error").isNull()).count()
        summary.skipped_confirmed = good - summary.messages
    capture.unpersist()
    return planned, stats


def _run_job(
    job: DataFrame,
    out: Path,
    total: int,
    progress: Callable[[dict[str, Any]], None] | None,
    stop: threading.Event | None,
) -> tuple[list[Any], list[BaseException]]:
    """Collect the send job in a thread while this one passes a stop request on to the tasks
    (the STOP file) and reports progress; the tasks' summary rows, and the job's failure."""
    results: list[Any] = []
    failure: list[BaseException] = []

    def collect() -> None:
        try:
            results.extend(job.collect())
        except BaseException as error:  # reported by the driver thread below
            failure.append(error)

    # PySpark's thread class: it pins and releases the thread's JVM connection properly.
    worker = InheritableThread(target=collect, name="replay-job", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.5)
        if stop is not None and stop.is_set() and not (out / "STOP").exists():
            (out / "STOP").write_text("stop requested\n")
        if progress is not None:
            progress(read_progress(out, total))
    return results, failure


def _add_results(summary: RunSummary, results: list[Any]) -> None:
    """The tasks' summary rows added into ``summary``."""
    for row in results:
        for name in ("sent", "confirmed", "nacked", "returned", "errors"):
            setattr(summary, name, getattr(summary, name) + int(row[name]))
        summary.stopped = summary.stopped or bool(row["stopped"])
        if row["failure"]:
            summary.failures.append(str(row["failure"]))


def read_progress(out: Path, total: int) -> dict[str, Any]:
    """The tasks' counters added up (for the progress bar)."""
    state: dict[str, Any] = {"total": total, "sent": 0, "confirmed": 0, "max_lag_ms": 0.0}
    for path in (out / "progress").glob("*.json"):
        try:
            counts = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being replaced right now
        state["sent"] += counts["sent"]
        state["confirmed"] += counts["confirmed"]
        state["max_lag_ms"] = max(state["max_lag_ms"], counts["max_lag_ms"])
    return state


def _write_run(out: Path, options: RunOptions, summary: RunSummary, plan: SendPlan | None) -> None:
    document = {
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items()},
        "plan": asdict(plan) if plan is not None else None,
        "summary": asdict(summary),
        "result_columns": RESULT_SCHEMA.names,
    }
    document["options"]["target"] = redact(options.target)
    if document["plan"] is not None:
        document["plan"]["target"] = redact(options.target)
    (out / "run.json").write_text(json.dumps(document, indent=2, default=str) + "\n")
