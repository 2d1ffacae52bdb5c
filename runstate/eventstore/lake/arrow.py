"""Events and run rows as Arrow, and Arrow as Spark DataFrames: the one conversion both sides use.

Timestamps travel as Arrow `timestamp[us, UTC]` end to end (never through pandas, whose nanoseconds
stop at 1677..2262 while the store keeps 0001..9999), JSON payloads as their text. A DataFrame is
made from Arrow IPC payloads decoded inside the tasks (`mapInArrow`): the rows pass the driver once,
as bytes, and the same code runs on a cluster (the payloads travel with the tasks).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from runstate.eventstore.contract import StoredEvent

if TYPE_CHECKING:
    import pyarrow as pa

# Every column of run_events, plus position, in the store's order (the lake names the payload column as
# Postgres does: event_data). The DDL is the table's and the frames' schema alike.
EVENT_COLUMNS = (
    ("run_id", "STRING NOT NULL"),
    ("run_seq", "BIGINT NOT NULL"),
    ("event_id", "STRING NOT NULL"),
    ("step_id", "STRING"),
    ("engine_attempt_id", "STRING"),
    ("logical_attempt_id", "STRING"),
    ("plan_version", "STRING"),
    ("event_type", "STRING NOT NULL"),
    ("event_data", "STRING"),
    ("idempotency_key", "STRING NOT NULL"),
    ("caused_by_signal_id", "STRING"),
    ("parent_event_id", "STRING"),
    ("emitted_at", "TIMESTAMP NOT NULL"),
    ("persisted_at", "TIMESTAMP NOT NULL"),
    ("adapter_version", "STRING"),
    ("engine_run_ref", "STRING"),
    ("position", "BIGINT NOT NULL"),
)
# One row per run (runs.py says what each holds).
RUNS_COLUMNS = (
    ("run_id", "STRING NOT NULL"),
    ("status", "STRING NOT NULL"),
    ("started_at", "TIMESTAMP"),
    ("completed_at", "TIMESTAMP"),
    ("first_event_at", "TIMESTAMP NOT NULL"),
    ("last_event_at", "TIMESTAMP NOT NULL"),
    ("duration_s", "DOUBLE NOT NULL"),
    ("event_count", "BIGINT NOT NULL"),
    ("failed_steps", "ARRAY<STRING> NOT NULL"),
    ("last_seq", "BIGINT NOT NULL"),
    ("last_position", "BIGINT NOT NULL"),
    ("snapshot", "STRING NOT NULL"),
)


def ddl(columns: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{name} {kind}" for name, kind in columns)


EVENT_DDL = ddl(EVENT_COLUMNS)
RUNS_DDL = ddl(RUNS_COLUMNS)
# StoredEvent's name of a column, where it differs.
_EVENT_FIELD = {"event_data": "data"}
_JSON_COLUMNS = ("event_data", "engine_run_ref")
_TIMESTAMP_COLUMNS = ("emitted_at", "persisted_at")
_INT_COLUMNS = ("run_seq", "position")
# One IPC payload (a task's share of a batch) stays under this size, so no task grows large.
PAYLOAD_BYTES = 4 << 20
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def json_text(value: Any) -> str | None:
    """A payload as the lake keeps it: canonical JSON text (None stays NULL)."""
    if value is None:
        return None
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _arrow_type(kind: str) -> pa.DataType:
    import pyarrow as pa

    base = kind.split()[0]
    if base == "STRING":
        return pa.string()
    if base == "BIGINT":
        return pa.int64()
    if base == "DOUBLE":
        return pa.float64()
    if base == "TIMESTAMP":
        return pa.timestamp("us", tz="UTC")
    if base == "ARRAY<STRING>":
        return pa.list_(pa.string())
    raise ValueError(f"no Arrow type for {kind!r}")


def arrow_schema(columns: Sequence[tuple[str, str]]) -> pa.Schema:
    import pyarrow as pa

    return pa.schema([pa.field(name, _arrow_type(kind), "NOT NULL" not in kind) for name, kind in columns])


def events_to_arrow(events: Sequence[StoredEvent]) -> pa.Table:
    """The events as one Arrow table of EVENT_COLUMNS."""
    import pyarrow as pa

    values: dict[str, list[Any]] = {}
    for name, _ in EVENT_COLUMNS:
        field = _EVENT_FIELD.get(name, name)
        column = [getattr(event, field) for event in events]
        values[name] = [json_text(value) for value in column] if name in _JSON_COLUMNS else column
    return pa.Table.from_pydict(values, schema=arrow_schema(EVENT_COLUMNS))


def event_from_mapping(row: dict[str, Any]) -> StoredEvent:
    """A StoredEvent from a row of EVENT_COLUMNS (timestamps as datetimes or epoch microseconds)."""
    fields = {_EVENT_FIELD.get(name, name): row[name] for name, _ in EVENT_COLUMNS}
    for name in _JSON_COLUMNS:
        field = _EVENT_FIELD.get(name, name)
        fields[field] = json.loads(fields[field]) if fields[field] is not None else None
    for name in _TIMESTAMP_COLUMNS:
        fields[name] = utc(fields[name])
    for name in _INT_COLUMNS:
        fields[name] = int(fields[name])
    return StoredEvent(**fields)


def events_from_arrow(table: pa.Table) -> list[StoredEvent]:
    return [event_from_mapping(row) for row in table.to_pylist()]


def utc(value: datetime | int | None) -> datetime | None:
    """A UTC datetime from an aware datetime or from epoch microseconds (how Spark rows carry them, since
    PySpark turns a timestamp into a naive local time); None stays None."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    return EPOCH + timedelta(microseconds=int(value))


def spark_select_list(columns: Sequence[tuple[str, str]], alias: str = "") -> str:
    """The columns for a Spark SELECT whose rows are collected: timestamps as epoch microseconds."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(
        f"unix_micros({prefix}{name}) AS {name}" if kind.startswith("TIMESTAMP") else f"{prefix}{name}"
        for name, kind in columns
    )


def ipc_payloads(table: pa.Table, slices: int) -> list[bytes]:
    """The table cut into at least `slices` Arrow IPC streams of at most about PAYLOAD_BYTES each."""
    import pyarrow as pa

    count = max(slices, math.ceil(table.nbytes / PAYLOAD_BYTES), 1)
    rows = max(1, math.ceil(table.num_rows / count))
    payloads = []
    for offset in range(0, table.num_rows, rows):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.slice(offset, rows))
        payloads.append(sink.getvalue().to_pybytes())
    return payloads


def decode_payloads(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The `mapInArrow` function: rows of IPC payloads in, the record batches they hold out."""
    import pyarrow as pa

    for batch in batches:
        for payload in batch.column(0).to_pylist():
            with pa.ipc.open_stream(payload) as reader:
                yield from reader


def arrow_frame(spark: Any, table: pa.Table, ddl: str) -> Any:
    """A DataFrame of `ddl` holding the Arrow table's rows, one slice per core (or per PAYLOAD_BYTES)."""
    payloads = ipc_payloads(table, spark.sparkContext.defaultParallelism)
    source = spark.createDataFrame([(bytearray(payload),) for payload in payloads], "payload BINARY")
    return source.mapInArrow(decode_payloads, ddl)
