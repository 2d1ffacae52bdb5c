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

Each table belongs to one event store: OWNER_PROPERTY names it (`<database>.<schema>`, `lake_owner()` of
the store). The export records it on the tables it creates, and claims a table made before tables had
owners, in a commit conditional on the table's metadata not having moved (two stores cannot both claim
it); an export, a read or an archive by another store is refused (ForeignHistory). Two stores in one
database each keep their history in a namespace of their own (by default the store's schema's name).

`runs` is partitioned by the day its runs were created (`created_at`, which never changes), and every
read and MERGE of a merge names the days of its runs (`created_days`): an export reads the partitions of
the runs it touches, mostly today's, not a table that grows for months.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from runstate.eventstore.lake import source
from runstate.eventstore.lake.arrow import EVENT_DDL, RUNS_DDL
from runstate.eventstore.lake.config import HistoryConfig
from runstate.eventstore.lake.errors import ForeignHistory, HistoryConflict, HistoryError
from runstate.spark import create_namespace

POSITION_PROPERTY = "runstate.feed.position"
OWNER_PROPERTY = "runstate.eventstore.owner"
# Attempts at claiming a table that records no owner, each conditional on the metadata it read.
_CLAIM_ATTEMPTS = 5
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


def ensure_tables(spark: Any, config: HistoryConfig, owner: str | None = None) -> None:
    """Create the namespace and both tables unless they exist (two runs racing: one creation wins); a runs
    table of an older layout is replaced by an empty one, which the next merge fills again from run_events.
    With `owner` (the store's name), both tables must be that store's: claimed when they name none,
    ForeignHistory when they name another."""
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
    if owner is not None:
        for ident in (config.events_table, config.runs_table):
            with spark_errors(ident, "claim"):
                check_owner(ident, _claimed(spark, ident, owner), owner, required=True)


def _claimed(spark: Any, ident: str, owner: str) -> str:
    """The table's owner, after claiming it for `owner` when it names none. The claim commits new metadata
    conditional on the metadata it read (the catalog's compare-and-swap), so of two stores claiming at
    once one wins and the other reads the winner. The owner goes through the Java API, never into SQL."""
    jvm = spark.sparkContext._jvm
    for _ in range(_CLAIM_ATTEMPTS):
        operations = iceberg_table(spark, ident).operations()
        base = operations.refresh()
        found = base.properties().get(OWNER_PROPERTY)
        if found is not None:
            return str(found)
        properties = jvm.java.util.HashMap(base.properties())
        properties.put(OWNER_PROPERTY, owner)
        try:
            operations.commit(base, base.replaceProperties(properties))
        except Exception as error:  # py4j: CommitFailedException when another commit came first
            if "CommitFailedException" not in str(error):
                raise
    raise HistoryError(f"{ident}: could not record its owner after {_CLAIM_ATTEMPTS} attempts")


def check_owner(ident: str, found: str | None, owner: str, *, required: bool) -> None:
    """ForeignHistory unless the table `ident`, whose owner property is `found`, is `owner`'s (`required`:
    a table that names no owner is refused too; else it is read, as made before tables had owners)."""
    if found == owner or (found is None and not required):
        return
    if found is None:
        raise ForeignHistory(
            f"{ident} names no event store as its owner (it was made before tables recorded one): export "
            "from this store once (`runstate events export`, or run_history_sensor), which claims it, then "
            "try again; nothing was changed"
        )
    raise ForeignHistory(
        f"{ident} belongs to the event store {found!r} (database.schema), not to this one ({owner!r}): "
        "each store keeps its run history in a namespace of its own (RUNSTATE_HISTORY_NAMESPACE, by default "
        "the store's schema); nothing was changed"
    )


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
        if f"ClassNotFoundException: {source.JDBC_DRIVER}" in text:
            raise HistoryError(f"{action} {ident} failed: {_missing_driver(source.JDBC_DRIVER)}") from None
        raise HistoryError(f"{action} {ident} failed: {_cause(text, error)}") from None


def _missing_driver(driver: str) -> str:
    # Spark reads the feed through the driver's jar, which runstate.spark finds on disk (or is told of).
    return (
        f"Spark cannot load the Postgres JDBC driver ({driver}): install it (apt-get install "
        "libpostgresql-jdbc-java puts it at /usr/share/java/postgresql.jar) or name its jar with RUNSTATE_JDBC_JAR"
    )


def _cause(text: str, error: BaseException) -> str:
    head = text.split("JVM stacktrace:")[0]
    lines = [line.strip() for line in head.splitlines() if line.strip()]
    useful = [line for line in lines if "Exception" in line and ":" in line]
    # A Java exception's line comes from py4j as ": its.Class: message".
    return (useful[0] if useful else lines[0] if lines else type(error).__name__).removeprefix(": ")[:500]
