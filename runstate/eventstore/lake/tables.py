"""The two history tables on Spark: their DDL, the feed position each has reached, and one place that
turns Spark failures into HistoryErrors.

Where a table's position lives:
- `run_events`: every export commit carries the feed position it reached as the snapshot summary
  property POSITION_PROPERTY, in the same commit as its rows. The current snapshot has it unless the
  maintenance service compacted the table since (a `replace` snapshot keeps no summary of ours): then
  the newest ancestor that has it says it; and if those were expired too, the rows do, as the largest
  `position` (every exported event carries its position, and the feed never adds one below it later).
- `runs`: each row carries the position of its run's last event (`last_position`), and a merge commits
  its rows together, so the table's largest `last_position` is the position its rows reflect. The
  table property POSITION_PROPERTY says the same without a scan: it is set after each merge's commit,
  so it is never ahead of the rows (when it lags, the next merge folds some runs again: runs.py).

`runs` is partitioned by the day its runs were created (`created_at`, which never changes), and every
read and MERGE of a merge names the days of its runs (`created_days`): an export reads the partitions of
the runs it touches, mostly today's, not a table that grows for months.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from runstate.eventstore.lake.arrow import EVENT_DDL, RUNS_DDL
from runstate.eventstore.lake.config import HistoryConfig
from runstate.eventstore.lake.errors import HistoryConflict, HistoryError
from runstate.spark import create_namespace

POSITION_PROPERTY = "runstate.feed.position"
# The property the maintenance orchestrator reads to opt a table in (named here: the event store core
# never imports the maintenance core).
MAINTENANCE_ENABLED_PROPERTY = "runstate.maintenance.enabled"
_COMMON = {"format-version": "2", MAINTENANCE_ENABLED_PROPERTY: "true"}
# Exports append rows of mostly today's partition: no shuffle before the write (fanout writers keep one
# open file per day a task sees instead).
EVENTS_PROPERTIES = {**_COMMON, "write.distribution-mode": "none", "write.spark.fanout.enabled": "true"}
# A merge touches a few rows of many files: it writes their new versions and position deletes rather
# than rewriting the files (maintenance applies the deletes).
RUNS_PROPERTIES = {
    **_COMMON,
    POSITION_PROPERTY: "0",
    "write.merge.mode": "merge-on-read",
    "write.update.mode": "merge-on-read",
    "write.delete.mode": "merge-on-read",
}
EVENTS_PARTITIONS = "days(emitted_at)"
RUNS_PARTITIONS = "days(created_at)"
# How far back along a table's history a position is looked for before the rows are asked.
_ANCESTORS_LOOKED_AT = 100


def _properties_sql(properties: dict[str, str]) -> str:
    return ", ".join(f"'{key}'='{value}'" for key, value in properties.items())  # our constants


def ensure_tables(spark: Any, config: HistoryConfig) -> None:
    """Create the namespace and both tables unless they exist (two runs racing: one creation wins); a runs
    table of an older layout is replaced by an empty one, which the next merge fills again from run_events."""
    with spark_errors(config.events_table, "create"):
        create_namespace(spark, config.namespace)
        for ident, ddl, clause, properties in (
            (config.events_table, EVENT_DDL, EVENTS_PARTITIONS, EVENTS_PROPERTIES),
            (config.runs_table, RUNS_DDL, RUNS_PARTITIONS, RUNS_PROPERTIES),
        ):
            try:
                spark.sql(f"CREATE TABLE IF NOT EXISTS {ident} {_table_sql(ddl, clause, properties)}")
            except Exception as error:
                if "already exists" not in str(error).lower():
                    raise
    with spark_errors(config.runs_table, "replace"):
        if iceberg_table(spark, config.runs_table).schema().findField("fold_state") is None:
            # Before 2026-11-29 runs had no partitions (every merge read it whole); before 2026-12-01 its
            # rows held the projection as JSON, folded in Python, and nothing a merge in Spark combines.
            runs = _table_sql(RUNS_DDL, RUNS_PARTITIONS, RUNS_PROPERTIES)
            spark.sql(f"CREATE OR REPLACE TABLE {config.runs_table} {runs}")


def _table_sql(ddl: str, partitions: str, properties: dict[str, str]) -> str:
    return (
        f"({ddl}) USING iceberg PARTITIONED BY ({partitions}) TBLPROPERTIES ({_properties_sql(properties)})"
    )


def created_days(times: Iterable[datetime], column: str = "created_at") -> tuple[str, dict[str, datetime]]:
    """A Spark SQL condition that `column` falls on one of the UTC days of `times` (consecutive days as one
    range), and its parameters: Iceberg prunes the runs table's partitions by it."""
    days = sorted({time_.astimezone(UTC).date() for time_ in times})
    ranges: list[list[date]] = []
    for day in days:
        if ranges and ranges[-1][1] == day:
            ranges[-1][1] = day + timedelta(days=1)
        else:
            ranges.append([day, day + timedelta(days=1)])
    terms, params = [], {}
    for n, (first, end) in enumerate(ranges):
        terms.append(f"({column} >= :day_from_{n} AND {column} < :day_to_{n})")
        params[f"day_from_{n}"] = datetime.combine(first, time(), UTC)
        params[f"day_to_{n}"] = datetime.combine(end, time(), UTC)
    return f"({' OR '.join(terms) or 'false'})", params


def iceberg_table(spark: Any, ident: str) -> Any:
    """The Iceberg table (a JVM object) behind `ident`, refreshed from the catalog: another process may
    have committed since this session last looked (the catalog caches tables). No Spark job."""
    jvm = spark.sparkContext._jvm
    table = jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, ident)
    table.refresh()
    return table


def first_position(summaries: Iterator[Any]) -> int | None:
    """The position property of the first summary (newest first) that has one, else None."""
    for summary in summaries:
        value = summary.get(POSITION_PROPERTY)
        if value is not None:
            return int(value)
    return None


def _ancestor_summaries(table: Any, snapshot: Any) -> Iterator[Any]:
    for _ in range(_ANCESTORS_LOOKED_AT):
        if snapshot is None:
            return
        yield snapshot.summary()
        parent = snapshot.parentId()
        snapshot = table.snapshot(parent) if parent is not None else None


def events_position(spark: Any, config: HistoryConfig) -> tuple[int | None, int]:
    """(current snapshot id of run_events, the feed position it has reached): (None, 0) when empty."""
    ident = config.events_table
    with spark_errors(ident, "read the position of"):
        table = iceberg_table(spark, ident)
        snapshot = table.currentSnapshot()
        if snapshot is None:
            return None, 0
        snapshot_id = int(snapshot.snapshotId())
        found = first_position(_ancestor_summaries(table, snapshot))
        if found is None:
            row = spark.sql(f"SELECT max(position) AS p FROM {ident} VERSION AS OF {snapshot_id}").first()
            found = int(row.p or 0)
    return snapshot_id, found


def runs_position(spark: Any, config: HistoryConfig) -> int:
    """The feed position the runs table reflects: its position property, else its largest last_position."""
    ident = config.runs_table
    with spark_errors(ident, "read the position of"):
        recorded = iceberg_table(spark, ident).properties().get(POSITION_PROPERTY)
        if recorded is not None:
            return int(recorded)
        row = spark.sql(f"SELECT max(last_position) AS p FROM {ident}").first()
    return int(row.p or 0)


def record_runs_position(spark: Any, config: HistoryConfig, position: int) -> None:
    """Record the position a merge's commit reached, after that commit."""
    ident = config.runs_table
    with spark_errors(ident, "record the position of"):
        spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ('{POSITION_PROPERTY}' = '{int(position)}')")


@contextmanager
def spark_errors(ident: str, action: str) -> Iterator[None]:
    """A Spark or JVM failure becomes one HistoryError line naming the table; a commit refused because
    another export committed first becomes a HistoryConflict."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    try:
        yield
    except (PySparkException, Py4JError) as error:
        text = str(error)
        if "ValidationException: Found conflicting files" in text:
            raise HistoryConflict(
                f"{ident}: another export committed while this one ran; nothing of this one was written, "
                "and the next export carries on from the table's position"
            ) from None
        raise HistoryError(f"{action} {ident} failed: {_cause(text, error)}") from None


def _cause(text: str, error: BaseException) -> str:
    head = text.split("JVM stacktrace:")[0]
    lines = [line.strip() for line in head.splitlines() if line.strip()]
    useful = [line for line in lines if "Exception" in line and ":" in line]
    # A Java exception's line comes from py4j as ": its.Class: message".
    return (useful[0] if useful else lines[0] if lines else type(error).__name__).removeprefix(": ")[:500]
