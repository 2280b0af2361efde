"""One replay sender, run inside a Spark task: its messages, in order, through one connection.

The task's rows arrive sorted by (schedule time, capture order); every order key lives in
exactly one task, so each key's messages go out in capture order over one channel, each no
earlier than its due time. Each publish is mandatory and confirmed, with up to
``SendPlan.window`` confirms outstanding (replay.confirm_window): a nack, a return or an error
is that message's result, not a failure. Results go to ``results.parquet/`` in small whole
files (written to a temporary name, then renamed), so a stopped or killed run keeps everything
flushed before; a per-task progress file feeds the driver's progress bar. A ``STOP`` file in
the output directory (the driver's Ctrl-C) ends the task at the next message, after the
confirms in flight.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from replay.amqp_props import stamp
from replay.confirm_window import Outgoing, WindowedSender
from replay.pacing import Schedule

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
    window: int = 1000  # unconfirmed publishes per sender
    # Exchanges the target lacks, with the 404 a publish to them gets: recorded, not sent.
    missing_exchanges: tuple[tuple[str, str], ...] = ()


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


class RowFeed:
    """The task's rows, in order, as the windowed sender's feed; outcomes into ``files``."""

    def __init__(
        self, plan: SendPlan, batches: Iterator[pa.RecordBatch], files: ResultFiles, stop: Path
    ) -> None:
        self.plan = plan
        self.files = files
        self.stop_file = stop
        self.schedule = Schedule(plan.start_s, plan.t0_ms, plan.speed, plan.rate_per_sender)
        self.missing = dict(plan.missing_exchanges)
        self.rows = (row for batch in batches for row in batch.to_pylist())
        self.head: dict[str, Any] | None = None
        self.head_due = 0.0
        self._advance()

    def _advance(self) -> None:
        self.head = next(self.rows, None)
        if self.head is not None:
            self.head_due = self.schedule.due(self.head["sched_ms"])

    def next_due(self) -> float | None:
        return None if self.head is None else self.head_due

    def stop_requested(self) -> bool:
        return self.stop_file.exists()

    def take(self) -> Outgoing | None:
        row, due = self.head, self.head_due
        assert row is not None
        self._advance()
        sent = time.time()
        result = _result(self.plan, row, due, sent)
        missing = self.missing.get(row["exchange"])
        if missing is not None:  # what publishing to it would do: close the channel, 404
            self.record(result, "error", missing)
            return None
        raw = stamp(row["properties_raw"], provenance(self.plan, row))
        return Outgoing(
            row["exchange"], row["routing_key"], raw, row["body"], row["capture_id"], result
        )

    def record(self, result: dict[str, Any], outcome: str, reason: str | None) -> None:
        result["done_ms"] = time.time() * 1000
        result["outcome"] = outcome
        result["reason"] = reason
        self.files.add(result)


def send_partition(plan: SendPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow body: send the task's rows; yields one summary row."""
    out = Path(plan.out_dir)
    task = uuid.uuid4().hex[:12]
    files = ResultFiles(out, task)
    feed = RowFeed(plan, batches, files, out / "STOP")
    sender = WindowedSender(plan.target, feed, feed.record, plan.window)
    failures: list[str] = []
    try:
        if feed.next_due() is not None:
            # Nothing is raised to Spark: a retried task would send its messages again.
            try:
                sender.run()
            except Exception as error:  # a bug, not the target: what was in flight is unknown
                sender.abandon(f"sender failed: {error!r}")
                failures.append(f"sender failed: {error!r}")
            if sender.failure:
                failures.append(sender.failure)
            if sender.unmatched_returns:
                failures.append(f"{sender.unmatched_returns} returns matched no message")
    finally:
        files.flush()
        files.write_progress(True)
    failure = "; ".join(failures) or None
    stopped = sender.stopped or sender.failure is not None
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


def _result(plan: SendPlan, row: dict[str, Any], due: float, sent: float) -> dict[str, Any]:
    """A result row; ``done_ms``, ``outcome`` and ``reason`` are filled in when it settles."""
    return {
        "capture_id": row["capture_id"],
        "seq": row["seq"],
        "order_key": row["order_key"],
        "key_seq": row["key_seq"],
        "ts_ms": row["ts_ms"],
        "due_ms": due * 1000,
        "sent_ms": sent * 1000,
        "done_ms": None,
        "lag_ms": max(0.0, (sent - due) * 1000),
        "outcome": None,
        "reason": None,
        "run_id": plan.run_id,
    }
