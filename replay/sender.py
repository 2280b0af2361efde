"""One replay sender, run inside a Spark task: its messages, in order, through one connection.

The task's rows arrive sorted by (schedule time, capture order); every order key lives in
exactly one task, so each key's messages go out in capture order over one channel. Each
publish is mandatory and confirmed (pika's BlockingConnection): a nack or a return is a
result, not a failure. Results go to ``results.parquet/`` in small whole files (written to a
temporary name, then renamed), so a stopped or killed run keeps everything flushed before;
a per-task progress file feeds the driver's progress bar. A ``STOP`` file in the output
directory (the driver's Ctrl-C) ends the task at the next message.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pyarrow as pa
import pyarrow.parquet as pq

from replay.amqp_props import RawProperties, stamp
from replay.pacing import Schedule, wait_until

RESULT_SCHEMA = pa.schema(
    [
        pa.field("capture_id", pa.string()),
        pa.field("seq", pa.int64()),
        pa.field("order_key", pa.string()),
        pa.field("key_seq", pa.int64()),
        pa.field("ts_ms", pa.int64()),
        pa.field("due_ms", pa.float64()),
        pa.field("sent_ms", pa.float64()),
        pa.field("done_ms", pa.float64()),
        pa.field("lag_ms", pa.float64()),
        pa.field("outcome", pa.string()),  # confirmed | nacked | returned | error
        pa.field("reason", pa.string()),
        pa.field("run_id", pa.string()),
    ]
)
SUMMARY_DDL = (
    "task string, sent long, confirmed long, nacked long, returned long, errors long, "
    "stopped boolean, failure string"
)
_FLUSH_ROWS = 10_000
_FLUSH_S = 2.0
_PROGRESS_S = 0.5


@dataclass(frozen=True)
class SendPlan:
    target: str
    out_dir: str
    run_id: str
    capture_name: str
    start_s: float
    t0_ms: int
    speed: float
    rate_per_sender: float | None


class ResultFiles:
    """Results of one task as whole Parquet files, and its progress counters."""

    def __init__(self, out_dir: Path, task: str) -> None:
        self.dir = out_dir / "results.parquet"
        self.progress = out_dir / "progress" / f"{task}.json"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.progress.parent.mkdir(parents=True, exist_ok=True)
        self.task = task
        self.rows: list[dict[str, Any]] = []
        self.parts = 0
        self.counts = dict.fromkeys(("sent", "confirmed", "nacked", "returned", "errors"), 0)
        self.max_lag_ms = 0.0
        self.last_flush = self.last_progress = time.monotonic()

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self.counts["sent"] += 1
        outcome = row["outcome"]
        self.counts["errors" if outcome == "error" else outcome] += 1
        self.max_lag_ms = max(self.max_lag_ms, row["lag_ms"])
        now = time.monotonic()
        if len(self.rows) >= _FLUSH_ROWS or now - self.last_flush >= _FLUSH_S:
            self.flush()
        if now - self.last_progress >= _PROGRESS_S:
            self.write_progress(False)

    def flush(self) -> None:
        self.last_flush = time.monotonic()
        if not self.rows:
            return
        table = pa.Table.from_pylist(self.rows, schema=RESULT_SCHEMA)
        final = self.dir / f"part-{self.task}-{self.parts:05d}.parquet"
        temporary = self.dir / f".{final.name}.tmp"
        pq.write_table(table, temporary)
        temporary.replace(final)  # readers never see half a file
        self.parts += 1
        self.rows = []

    def write_progress(self, finished: bool) -> None:
        self.last_progress = time.monotonic()
        state = {**self.counts, "max_lag_ms": self.max_lag_ms, "finished": finished}
        temporary = self.progress.with_suffix(".tmp")
        temporary.write_text(json.dumps(state))
        temporary.replace(self.progress)


class Publisher:
    """A confirming, mandatory publisher that reconnects once after a lost connection."""

    def __init__(self, url: str) -> None:
        self.parameters = pika.URLParameters(url)
        self.connection: pika.BlockingConnection | None = None
        self.channel: Any = None
        self._open()

    def _open(self) -> None:
        if self.connection is None or not self.connection.is_open:
            self.connection = pika.BlockingConnection(self.parameters)
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()

    def publish(self, exchange: str, routing_key: str, properties: bytes, body: bytes) -> str:
        """The outcome ("confirmed", "nacked", "returned") or raises ``PublishError``."""
        for attempt in (1, 2):
            try:
                self.channel.basic_publish(
                    exchange, routing_key, body, RawProperties(properties), mandatory=True
                )
                return "confirmed"
            except pika.exceptions.UnroutableError:
                return "returned"
            except pika.exceptions.NackError:
                return "nacked"
            except pika.exceptions.ChannelClosedByBroker as closed:
                # e.g. 404 for an exchange the target lacks: this message's result; go on.
                self._open()
                raise PublishError(
                    f"channel closed: {closed.reply_code} {closed.reply_text}"
                ) from None
            except pika.exceptions.AMQPConnectionError as lost:
                if attempt == 2:
                    raise PublishError(f"connection lost: {lost!r}", fatal=True) from lost
                self.connection = None
                self._open()
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.connection is not None and self.connection.is_open:
            self.connection.close()


class PublishError(Exception):
    def __init__(self, reason: str, fatal: bool = False) -> None:
        super().__init__(reason)
        self.fatal = fatal


def send_partition(plan: SendPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: send the task's rows; yields one summary row."""
    out = Path(plan.out_dir)
    stop_file = out / "STOP"
    task = uuid.uuid4().hex[:12]
    files = ResultFiles(out, task)
    schedule = Schedule(plan.start_s, plan.t0_ms, plan.speed, plan.rate_per_sender)
    stopped = False
    failure = None
    publisher: Publisher | None = None
    try:
        for batch in batches:
            for row in batch.to_pylist():
                due = schedule.due(row["sched_ms"])
                if not wait_until(due, stop_file.exists) or stop_file.exists():
                    stopped = True
                    break
                try:
                    publisher = publisher or Publisher(plan.target)
                    files.add(_send_one(publisher, plan, row, due))
                except (PublishError, pika.exceptions.AMQPError) as error:
                    # Not raised to Spark: a retried task would send its messages again.
                    failure = f"{error}"
                    stopped = True
                    break
            if stopped:
                break
    finally:
        files.flush()
        files.write_progress(True)
        if publisher is not None:
            publisher.close()
    summary = {"task": task, **files.counts, "stopped": stopped, "failure": failure}
    yield pa.RecordBatch.from_pylist([summary])


def provenance(plan: SendPlan, row: dict[str, Any]) -> dict[str, Any]:
    return {
        "capture": plan.capture_name,
        "id": row["capture_id"],
        "ts": int(row["ts_ms"]),
        "connection": row["connection"] or "",
        "channel": int(row["channel"] or 0),
        "seq": int(row["key_seq"]),
    }


def _send_one(
    publisher: Publisher, plan: SendPlan, row: dict[str, Any], due: float
) -> dict[str, Any]:
    raw = stamp(row["properties_raw"], provenance(plan, row))
    sent = time.time()
    try:
        outcome = publisher.publish(row["exchange"], row["routing_key"], raw, row["body"])
        reason = None
    except PublishError as error:
        if error.fatal:
            raise
        outcome, reason = "error", str(error)
    done = time.time()
    return {
        "capture_id": row["capture_id"],
        "seq": row["seq"],
        "order_key": row["order_key"],
        "key_seq": row["key_seq"],
        "ts_ms": row["ts_ms"],
        "due_ms": due * 1000,
        "sent_ms": sent * 1000,
        "done_ms": done * 1000,
        "lag_ms": max(0.0, (sent - due) * 1000),
        "outcome": outcome,
        "reason": reason,
        "run_id": plan.run_id,
    }
