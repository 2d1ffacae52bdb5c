"""Export the feed into the run history, exactly once and in feed order: the command that the Dagster
asset, `runstate events export` and the benchmark all run.

Each turn reads the position `run_events` has reached, bounds the feed's next batch after it (the
store counts it and finds its last position), and appends the batch, read from Postgres by Spark's JDBC
source (source.py), in ONE Iceberg commit that also records the batch's last position (tables.py). Why
no event is written twice or skipped:
- the feed returns every event once, in position order, and never adds one below a position it has
  returned: so the batch after the table's position is exactly what the table lacks, and Spark reads
  exactly that batch (source.py says why);
- the commit is conditional: it overwrites `position > after` (nothing: no such row exists) with
  serializable isolation from the snapshot the position was read at, so Iceberg refuses it when any
  other commit added rows since (a second export racing this one, or one that finished while this one
  read the feed). The loser writes nothing (HistoryConflict) and carries on from the position the
  winner reached (`once`: it stops there with the conflict); a compaction, which adds no rows, does not
  refuse it;
- a killed export either committed (the position moved with its rows) or left nothing but files no
  snapshot references (the maintenance service removes orphans).
Then `runs` is merged from the events committed (runs.py), in one commit for all the batches, under its
own position, so a crash between the commits only leaves runs behind until the next export merges the
range.

The tables belong to the store that exports into them (tables.py: OWNER_PROPERTY): another store's
export is refused before it reads the position, which is a position in the owner's feed, not its own.

Only a store that declares a gap-free feed (GAP_FREE_FEED: Postgres) is exported: its feed never skips
an event that commits late. A Snowflake feed can (no commit-ordered high-water mark), and a history
with holes is worse than none.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from runstate.eventstore.feed import GAP_FREE_FEED
from runstate.eventstore.lake.config import HistoryConfig
from runstate.eventstore.lake.errors import FeedRefused, HistoryConflict
from runstate.eventstore.lake.runs import RunsMerged, merge_runs
from runstate.eventstore.lake.source import FeedRange, next_range, range_frame
from runstate.eventstore.lake.tables import POSITION_PROPERTY, ensure_tables, events_position, spark_errors


@dataclass(frozen=True)
class EventsCommitted:
    """One commit to run_events: the events after `from_position` up to `position`."""

    table: str
    from_position: int
    position: int
    events: int
    seconds: float

    def describe(self) -> str:
        return (
            f"{self.events} event(s) committed to {self.table}, positions "
            f"{self.from_position} -> {self.position}, in {self.seconds:.1f} s"
        )


ExportStep = EventsCommitted | RunsMerged
# Another export's merge committing first each time this one tries, this many times: something is wrong.
MERGES_BEATEN_IN_A_ROW = 10


@dataclass
class ExportTally:
    """What an export's steps added up to, as the CLI and the Dagster asset report it."""

    events: int = 0
    commits: int = 0
    runs_merged: int = 0
    from_position: int | None = None
    position: int | None = None

    def add(self, step: ExportStep) -> None:
        if self.from_position is None:
            self.from_position = step.from_position
        self.position = step.position
        if isinstance(step, EventsCommitted):
            self.events, self.commits = self.events + step.events, self.commits + 1
        else:
            self.runs_merged += step.runs


def check_feed(feed: Any) -> None:
    """FeedRefused unless `feed` is a store whose feed never skips an event (it declares GAP_FREE_FEED:
    Postgres's)."""
    if GAP_FREE_FEED in getattr(feed, "capabilities", ()):
        return
    raise FeedRefused(
        f"the run history is exported from a Postgres event store only, not from a {type(feed).__name__}: "
        "a Snowflake feed has no commit-ordered high-water mark, so overlapping appends can commit below "
        "a position already read and an export would skip them for good (set RUNSTATE_EVENTSTORE=postgres)"
    )


def commit_events(
    spark: Any, feed: Any, config: HistoryConfig, snapshot_id: int | None, batch: FeedRange
) -> EventsCommitted:
    """Append the feed's `batch` to run_events in one commit, conditional on no rows having been added
    since `snapshot_id` (None: since the table was created), with the position it reaches."""
    from pyspark.sql.functions import col

    started = time.perf_counter()
    ident = config.events_table
    with spark_errors(ident, "append to"):  # the JDBC source reads its schema from Postgres already
        writer = (
            range_frame(spark, feed, batch)
            .writeTo(ident)
            .option(f"snapshot-property.{POSITION_PROPERTY}", str(batch.upto))
            .option("isolation-level", "serializable")
            # JDBC columns are all nullable to Spark; the store's NOT NULL columns hold no NULL to refuse.
            .option("check-nullability", "false")
        )
        if snapshot_id is not None:
            writer = writer.option("validate-from-snapshot-id", str(snapshot_id))
        writer.overwrite(col("position") > batch.after)
    return EventsCommitted(ident, batch.after, batch.upto, batch.events, time.perf_counter() - started)


def export_history(
    spark: Any, feed: Any, config: HistoryConfig, *, once: bool = False
) -> Iterator[ExportStep]:
    """Export the feed after the table's position, a batch per commit, until the feed is read to its end
    (`once`: one batch), then merge runs up to the position reached; yields each commit as it lands.

    A commit or a merge that another export beat carries on from where that one got (`once`: it raises
    the HistoryConflict)."""
    check_feed(feed)
    ensure_tables(spark, config, owner=feed.lake_owner())  # another store's tables: ForeignHistory
    while True:
        snapshot_id, after = events_position(spark, config)
        batch = next_range(feed, after, config.batch_events)
        if batch is not None:
            try:
                step = commit_events(spark, feed, config, snapshot_id, batch)
            except HistoryConflict:
                if once or events_position(spark, config)[1] <= after:  # no other export got further
                    raise
                continue
            yield step
        if once or batch is None or batch.events < config.batch_events:
            break
    beaten = 0
    while True:
        try:
            merged = merge_runs(spark, feed, config)
        except HistoryConflict:
            beaten += 1
            if once or beaten == MERGES_BEATEN_IN_A_ROW:
                raise
            continue  # another export's merge committed first: the next one starts where it got
        if merged is None:
            return
        beaten = 0
        yield merged
