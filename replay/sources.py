"""The Spark data sources (Python Data Source API, Arrow batches):

    spark.read.format("rabbitmq-trace").load("/var/tmp/rabbitmq-tracing/t1.log")
    spark.read.format("firehose").load("capture-dir")      # from `mqgw replay capture`
    spark.read.format("mqgw-log").load("/var/lib/mqgw")    # options: from, to, queue, names
    spark.read.format("mqgw-log").load("/tmp/mq")          # a `mqgw cluster` dir: every group

All three yield the capture columns (replay.schema); ``mqgw-log`` adds the log's own
(offset, store and born time, queues, destinations, flags, broker group). Partitions: a range
of lines of a trace file, a Parquet file of a capture, a commitlog segment (of each group's
log, for a cluster: offsets are per group, so a record is (broker_group, offset) there).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from replay.amqp_props import as_row, decode
from replay.log_reader import (
    LogRecord,
    LogStore,
    QueueName,
    QueueNames,
    log_stores,
    names_from_json,
    open_commit_log,
    read_segment,
    segment_starts,
    target_queue_names,
)
from replay.schema import CAPTURE_ARROW, CAPTURE_COLUMNS, CAPTURE_DDL, empty_row, to_batch
from replay.trace_format import LineRange, read_range, split_ranges, trace_files
from storage.record import REDELIVERED

_BATCH_ROWS = 4096


class _Part(InputPartition):
    def __init__(self, value: Any) -> None:
        super().__init__(value)
        self.value = value


def _path_option(options: MutableMapping[str, str], source: str) -> Path:
    path = options.get("path")
    if not path:
        raise ValueError(f"{source}: give a path: spark.read.format({source!r}).load(PATH)")
    return Path(path)


def _batches(rows: Iterator[dict[str, Any]], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= _BATCH_ROWS:
            yield to_batch(batch, schema)
            batch = []
    if batch:
        yield to_batch(batch, schema)


# -- rabbitmq-trace ------------------------------------------------------------------------------


class TraceSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "rabbitmq-trace"

    def schema(self) -> str:
        return CAPTURE_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return TraceReader(_path_option(self.options, "rabbitmq-trace"))


class TraceReader(DataSourceReader):
    def __init__(self, path: Path) -> None:
        self.path = path

    def partitions(self) -> Sequence[InputPartition]:
        return [_Part(r) for r in split_ranges(trace_files(self.path))] or [_Part(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        part: LineRange | None = partition.value
        if part is not None:
            yield from _batches(read_range(part), CAPTURE_ARROW)


# -- firehose (Parquet written by `mqgw replay capture`) -----------------------------------------


class FirehoseSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "firehose"

    def schema(self) -> str:
        return CAPTURE_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return FirehoseReader(_path_option(self.options, "firehose"))


class FirehoseReader(DataSourceReader):
    def __init__(self, path: Path) -> None:
        self.path = path

    def partitions(self) -> Sequence[InputPartition]:
        if self.path.is_file():
            files = [self.path]
        elif self.path.is_dir():
            files = sorted(self.path.glob("*.parquet"))
        else:
            raise FileNotFoundError(f"{self.path}: no such capture")
        return [_Part(str(f)) for f in files] or [_Part(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if partition.value is None:
            return
        table = pq.read_table(partition.value, schema=CAPTURE_ARROW)
        yield from table.to_batches(_BATCH_ROWS)


# -- mqgw-log ------------------------------------------------------------------------------------

LOG_EXTRA_COLUMNS: tuple[tuple[str, str], ...] = (
    ("offset", "long"),
    ("store_ts_ms", "long"),
    ("born_ts_ms", "long"),
    ("store_time", "timestamp"),
    ("queues", "array<string>"),
    ("destinations", "array<struct<queue_id: long, partition: int>>"),
    ("flags", "int"),
    ("redelivered", "boolean"),
    ("broker_group", "string"),
)
LOG_DDL = CAPTURE_DDL + ", " + ", ".join(f"{n} {t}" for n, t in LOG_EXTRA_COLUMNS)
_DESTINATION = pa.struct([pa.field("queue_id", pa.int64()), pa.field("partition", pa.int32())])
LOG_ARROW = pa.schema(
    [
        *CAPTURE_ARROW,
        pa.field("offset", pa.int64()),
        pa.field("store_ts_ms", pa.int64()),
        pa.field("born_ts_ms", pa.int64()),
        pa.field("store_time", pa.timestamp("us", tz="UTC")),
        pa.field("queues", pa.list_(pa.string())),
        pa.field("destinations", pa.list_(_DESTINATION)),
        pa.field("flags", pa.int32()),
        pa.field("redelivered", pa.bool_()),
        pa.field("broker_group", pa.string()),
    ]
)


def parse_time_option(text: str | None) -> int | None:
    """``from`` / ``to``: ms since the epoch, or ISO 8601 (UTC unless it says otherwise)."""
    if text is None or text == "":
        return None
    if text.lstrip("-").isdigit():
        return int(text)
    moment = datetime.datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


class MqgwLogSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "mqgw-log"

    def schema(self) -> str:
        return LOG_DDL

    def reader(self, schema: Any) -> DataSourceReader:
        queues = self.options.get("queue")
        path = _path_option(self.options, "mqgw-log")
        names = self.options.get("names")  # given by the caller, or looked up here
        return MqgwLogReader(
            log_stores(path),
            names_from_json(names) if names else target_queue_names(path),
            parse_time_option(self.options.get("from")),
            parse_time_option(self.options.get("to")),
            frozenset(q for q in (queues or "").split(",") if q),
        )


class MqgwLogReader(DataSourceReader):
    def __init__(
        self,
        stores: list[LogStore],
        names: QueueNames,
        from_ms: int | None,
        to_ms: int | None,
        queues: frozenset[str],
    ) -> None:
        self.stores = stores
        self.names = dict(names)
        self.from_ms = from_ms
        self.to_ms = to_ms
        self.queues = queues

    def partitions(self) -> Sequence[InputPartition]:
        parts: list[InputPartition] = []
        for index, store in enumerate(self.stores):
            commit_log = open_commit_log(store.path)
            try:
                parts += [_Part((index, s)) for s in segment_starts(commit_log, self.from_ms)]
            finally:
                commit_log.close()
        return parts or [_Part(None)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if partition.value is None:
            return
        index, segment_start = partition.value
        store = self.stores[index]
        commit_log = open_commit_log(store.path)
        try:
            for records in read_segment(commit_log, segment_start):
                rows = [r for r in (self._row(rec, store) for rec in records) if r is not None]
                if rows:
                    yield to_batch(rows, LOG_ARROW)
        finally:
            commit_log.close()

    def _row(self, record: LogRecord, store: LogStore) -> dict[str, Any] | None:
        if self.from_ms is not None and record.store_ts_ms < self.from_ms:
            return None
        if self.to_ms is not None and record.store_ts_ms >= self.to_ms:
            return None
        names = self.names
        queues = [
            names[q] if q in names else QueueName("", f"#{q}") for q, _ in record.destinations
        ]
        if self.queues and not self.queues.intersection(q.name for q in queues):
            return None
        row = empty_row(CAPTURE_COLUMNS)
        try:
            properties: dict[str, Any] | None = as_row(decode(record.properties))
        except Exception as error:  # pika raises struct/Index/Unicode errors on bad bytes
            properties = None
            row["error"] = f"undecodable properties: {error}"
        ts = record.born_ts_ms or record.store_ts_ms
        row.update(
            # a cluster's groups each count offsets from 0: the group makes the id unique
            capture_id=f"{store.group}:{record.offset}" if store.group else str(record.offset),
            seq=record.offset,
            ts_ms=ts,
            vhost=next((q.vhost for q in queues if q.vhost), None),
            exchange=record.exchange.decode("utf-8", "replace"),
            routing_key=record.routing_key.decode("utf-8", "replace"),
            routing_keys=[record.routing_key.decode("utf-8", "replace")],
            routed_queues=[q.name for q in queues],
            properties=properties,
            properties_raw=record.properties,
            body=record.body,
            line=None,
            source_file=str(store.path),
            offset=record.offset,
            store_ts_ms=record.store_ts_ms,
            born_ts_ms=record.born_ts_ms,
            store_time=datetime.datetime.fromtimestamp(record.store_ts_ms / 1000, datetime.UTC),
            queues=[q.name for q in queues],
            destinations=[{"queue_id": q, "partition": p} for q, p in record.destinations],
            flags=record.flags,
            redelivered=bool(record.flags & REDELIVERED),
            broker_group=store.group,
        )
        return row
