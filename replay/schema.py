"""The columns every capture source yields, so replay and reconcile never look at a format.

One row per captured publish (``error`` set: a line or record that could not be read, kept
with its ``line`` so it is counted and reported, never dropped). ``properties_raw`` is what
is sent; ``properties`` is the decoded view for SQL.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from replay.amqp_props import PROPERTIES_DDL, PROPERTY_FIELDS

CAPTURE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("capture_id", "string"),  # unique within the capture; the provenance header's "id"
    ("seq", "long"),  # capture order
    ("ts_ms", "long"),  # original publish time, ms since the epoch
    ("vhost", "string"),
    ("connection", "string"),
    ("channel", "long"),
    ("exchange", "string"),
    ("routing_key", "string"),
    ("routing_keys", "array<string>"),  # the routing key plus CC/BCC, as RabbitMQ lists them
    ("routed_queues", "array<string>"),  # null when the capture does not say
    ("properties", PROPERTIES_DDL),
    ("properties_raw", "binary"),
    ("body", "binary"),
    ("line", "long"),  # 1-based line (rabbitmq-trace) or record number in its file
    ("source_file", "string"),
    ("error", "string"),
)
CAPTURE_DDL = ", ".join(f"{name} {kind}" for name, kind in CAPTURE_COLUMNS)

_ARROW_PROPERTY_TYPES = {"string": pa.string(), "int": pa.int32(), "long": pa.int64()}
ARROW_PROPERTIES = pa.struct(
    [pa.field(name, _ARROW_PROPERTY_TYPES[kind]) for name, kind in PROPERTY_FIELDS]
)
_ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "int": pa.int32(),
    "binary": pa.binary(),
    "boolean": pa.bool_(),
    "array<string>": pa.list_(pa.string()),
    PROPERTIES_DDL: ARROW_PROPERTIES,
}


def arrow_schema(columns: tuple[tuple[str, str], ...]) -> pa.Schema:
    return pa.schema([pa.field(name, _ARROW_TYPES[kind]) for name, kind in columns])


CAPTURE_ARROW = arrow_schema(CAPTURE_COLUMNS)


def empty_row(columns: tuple[tuple[str, str], ...] = CAPTURE_COLUMNS) -> dict[str, Any]:
    return dict.fromkeys((name for name, _ in columns), None)


def to_batch(rows: list[dict[str, Any]], schema: pa.Schema = CAPTURE_ARROW) -> pa.RecordBatch:
    columns = {f.name: [row.get(f.name) for row in rows] for f in schema}
    return pa.RecordBatch.from_pydict(columns, schema=schema)
