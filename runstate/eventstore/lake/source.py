"""The feed's next batch as a Spark DataFrame that Spark's JDBC source reads from Postgres itself: the rows
go from Postgres to the executors and on into Iceberg without passing through Python (the driver only
learns how many there are).

- The store bounds a batch first (`feed_bound`): how many events the feed's next page holds and the
  position of its last. Every event up to it lies below the feed's horizon: it has committed, and no
  transaction still running can add one below it (pg_feed.py).
- Spark then reads the range (after, upto] of the store's export query (feed.sql's export_rows), cut into
  one position range per core. Each range is one statement, which sees an event in exactly one of
  run_events and run_events_archive (an archive moves events in one transaction), and nothing deletes an
  event above the history's position (an archive to the lake drops exported runs only). So the frame
  holds exactly the batch's events, whenever and wherever its ranges are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runstate.eventstore.lake.arrow import EVENT_COLUMNS, spark_column
from runstate.eventstore.lake.errors import HistoryError

# A JDBC range per this many events at least: a small batch is one statement.
EVENTS_PER_RANGE = 10_000
# Rows per round trip of the JDBC driver (its default reads a whole range before the first row).
JDBC_FETCH_SIZE = 10_000
# A range's statement that runs longer than this fails the export (its run ends and the next one carries
# on) instead of holding the run for ever: a range of the largest batch reads in well under a minute.
JDBC_QUERY_TIMEOUT_S = 600
# The class Spark loads from the Postgres JDBC jar (runstate.spark.postgres_jdbc_jar puts it in spark.jars).
JDBC_DRIVER = "org.postgresql.Driver"


@dataclass(frozen=True)
class FeedRange:
    """The feed's events after `after` up to `upto` (both positions): `events` of them."""

    after: int
    upto: int
    events: int


def next_range(feed: Any, after: int, limit: int) -> FeedRange | None:
    """The feed's next batch of at most `limit` events after `after`, or None when it has none."""
    events, upto = feed.feed_bound(after, limit)
    if not events:
        return None
    if upto <= after:
        raise HistoryError(f"the feed bounded a batch after position {after} at {upto}: positions must grow")
    return FeedRange(after, upto, events)


def range_frame(spark: Any, feed: Any, batch: FeedRange) -> Any:
    """The batch's events as a DataFrame of EVENT_COLUMNS, read by Spark from the store's Postgres."""
    from runstate.spark import SparkSetupError, jdbc_url

    try:
        url, user, password = jdbc_url(feed.datastore.dsn)
    except SparkSetupError as error:
        raise HistoryError(str(error)) from None
    ranges = max(1, min(spark.sparkContext.defaultParallelism, batch.events // EVENTS_PER_RANGE))
    reader = (
        spark.read.format("jdbc")
        .option("driver", JDBC_DRIVER)
        .option("url", url)
        .option("currentSchema", feed.datastore.schema)
        .option("dbtable", f"({feed.export_query()}) AS export_rows")
        .option("fetchsize", JDBC_FETCH_SIZE)
        .option("queryTimeout", JDBC_QUERY_TIMEOUT_S)
        .option("partitionColumn", "position")
        .option("lowerBound", batch.after + 1)
        .option("upperBound", batch.upto + 1)
        .option("numPartitions", ranges)
    )
    for name, value in (("user", user), ("password", password)):
        if value:
            reader = reader.option(name, value)
    rows = reader.load().where(f"position > {int(batch.after)} AND position <= {int(batch.upto)}")
    return rows.selectExpr(*(spark_column(name, kind) for name, kind in EVENT_COLUMNS))
