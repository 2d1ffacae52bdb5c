"""The history's columns, and its rows between Spark, Arrow and Python.

Timestamps travel as Arrow `timestamp[us, UTC]` or as epoch microseconds, never as pandas timestamps,
whose nanoseconds stop at 1677..2262 while the store keeps 0001..9999; JSON payloads as their text. Rows come back from
Spark in Arrow batches (`collect_arrow`) and become Python values a column at a time; rows made in
Python (the runs' creation times) go to Spark in Arrow batches too (`arrow_frame`).
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from runstate.eventstore.contract import StoredEvent
from runstate.eventstore.rows import row_to_event

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
    ("created_at", "TIMESTAMP NOT NULL"),
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
    ("steps", "MAP<STRING, STRUCT<status: STRING, starts: BIGINT, seq: BIGINT>> NOT NULL"),
    (
        "fold_state",
        "STRUCT<terminal_seq: BIGINT, started_seq: BIGINT, lifecycle_seq: BIGINT, lifecycle_event: STRING, "
        "activated: BOOLEAN> NOT NULL",
    ),
)


def ddl(columns: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{name} {kind}" for name, kind in columns)


EVENT_DDL = ddl(EVENT_COLUMNS)
RUNS_DDL = ddl(RUNS_COLUMNS)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The suffix of a timestamp column's name where it crosses to Spark as epoch microseconds (sql/'s
# export_rows names its columns so too).
MICROS_SUFFIX = "_us"


def events_from_arrow(table: pa.Table) -> list[StoredEvent]:
    """StoredEvents from an Arrow table of EVENT_COLUMNS, built a column at a time."""
    with collector_paused():
        columns = [python_values(table.column(name)) for name, _ in EVENT_COLUMNS]
        return [row_to_event(row, decode_json=json.loads) for row in zip(*columns, strict=True)]


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while many acyclic objects are made: each full young generation
    would scan them all again (about 40 % of the time of 200,000 rows' values)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def python_values(column: pa.ChunkedArray) -> list[Any]:
    """A column's Python values; timestamps as UTC datetimes, whatever zone the reader gave them, made
    from their epoch microseconds (six times faster than pyarrow's own conversion of zoned ones)."""
    import pyarrow as pa

    if not pa.types.is_timestamp(column.type):
        return column.to_pylist()
    micros = column.cast(pa.timestamp("us", tz=column.type.tz)).cast(pa.int64()).to_pylist()
    return [None if value is None else EPOCH + timedelta(microseconds=value) for value in micros]


def collect_arrow(frame: Any) -> pa.Table:
    """A DataFrame's rows as one Arrow table, sent by the JVM in Arrow batches (no Row per row); no rows
    give columns of the null type. PySpark 3.5 names this private; 4.0 calls it `DataFrame.toArrow()`."""
    import pyarrow as pa

    batches = frame._collect_as_arrow()
    if batches:
        return pa.Table.from_batches(batches)
    return pa.table({name: pa.array([], pa.null()) for name in frame.columns})


def spark_column(name: str, kind: str) -> str:
    """The Spark expression of a column that crossed as epoch microseconds if it is a timestamp."""
    if kind.startswith("TIMESTAMP"):
        return f"timestamp_micros({name}{MICROS_SUFFIX}) AS {name}"
    return name


def arrow_frame(spark: Any, table: pa.Table, columns: Sequence[tuple[str, str]]) -> Any:
    """A DataFrame of `columns` holding the Arrow table's rows, sent to the JVM in Arrow batches (Spark's
    pandas bridge), read again at no cost. Timestamps cross as
    epoch microseconds (pandas would cut them to 1677..2262) and integers as objects (a NULL would make a
    column of floats)."""
    import pyarrow as pa

    sent, ddl, select = {}, [], []
    for name, kind in columns:
        column, kind = table.column(name), kind.replace(" NOT NULL", "")
        if kind == "TIMESTAMP":
            sent[name + MICROS_SUFFIX] = column.cast(pa.int64())
            ddl.append(f"{name}{MICROS_SUFFIX} BIGINT")
        else:
            sent[name] = column
            ddl.append(f"{name} {kind}")
        select.append(spark_column(name, kind))
    rows = pa.table(sent).to_pandas(integer_object_nulls=True)
    return spark.createDataFrame(rows, ", ".join(ddl)).selectExpr(*select)
