"""Export the feed into the run history, exactly once and in feed order: the command that the Dagster
asset, `runstate events export` and the benchmark all run.

Each turn reads the position `run_events` has reached and the feed's next batch after it
(`fetch_all`, the store's public feed), and appends the batch in ONE Iceberg commit that also records
the batch's last position (tables.py). Why no event is written twice or skipped:
- the feed returns every event once, in position order, and never adds one below a position it has
  returned: so the batch after the table's position is exactly what the table lacks;
- the commit is conditional: it overwrites `position > after` (nothing: no such row exists) with
  serializable isolation from the snapshot the position was read at, so Iceberg refuses it when any
  other commit added rows since (a second export racing this one, or one that finished while this one
  read the feed). The loser writes nothing and says so (HistoryConflict); a compaction, which adds no
  rows, does not refuse it;
- a killed export either committed (the position moved with its rows) or left nothing but files no
  snapshot references (the maintenance service removes orphans).
Then `runs` is merged from the same events (runs.py) under its own position, so a crash between the
two commits only leaves runs behind until the next export merges the range.

Only a Postgres store is exported: its feed never skips an event that commits late. A Snowflake
feed can (no commit-ordered high-water mark), and a history with holes is worse than none.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from runstate.eventstore.contract import StoredEvent
from runstate.eventstore.lake.arrow import EVENT_DDL, arrow_frame, events_to_arrow
from runstate.eventstore.lake.config import HistoryConfig
from runstate.eventstore.lake.errors import FeedRefused, HistoryError
from runstate.eventstore.lake.runs import RunsMerged, merge_runs
from runstate.eventstore.lake.tables import POSITION_PROPERTY, ensure_tables, events_position, spark_errors

# Events per feed read: a page of the feed costs O(limit), and a batch is read in pages of this many.
FEED_PAGE = 10_000


@dataclass(frozen=True)
class EventsCommitted:
    """One commit to run_events: the events after `from_position` up to `position`."""

    table: str
    from_position: int
    position: int
    events: int
    runs: int
    seconds: float

    def describe(self) -> str:
        return (
            f"{self.events} event(s) of {self.runs} run(s) committed to {self.table}, positions "
            f"{self.from_position} -> {self.position}, in {self.seconds:.1f} s"
        )


ExportStep = EventsCommitted | RunsMerged


def check_feed(feed: Any) -> None:
    """FeedRefused unless `feed` is a store whose feed never skips an event (Postgres)."""
    from runstate.eventstore.postgres import PostgresEventStore

    if isinstance(feed, PostgresEventStore):
        return
    raise FeedRefused(
        f"the run history is exported from a Postgres event store only, not from a {type(feed).__name__}: "
        "a Snowflake feed has no commit-ordered high-water mark, so overlapping appends can commit below "
        "a position already read and an export would skip them for good (set RUNSTATE_EVENTSTORE=postgres)"
    )


def read_batch(feed: Any, after: int, limit: int, page: int = FEED_PAGE) -> list[StoredEvent]:
    """Up to `limit` events of the feed after `after`, read in pages; positions must only grow."""
    events: list[StoredEvent] = []
    position = after
    while len(events) < limit:
        want = min(page, limit - len(events))
        chunk = feed.fetch_all(position, want)
        for event in chunk:
            if event.position is None or event.position <= position:
                raise HistoryError(
                    f"the feed returned position {event.position!r} after {position}: positions must grow"
                )
            position = event.position
        events += chunk
        if len(chunk) < want:
            break
    return events


def commit_events(
    spark: Any, config: HistoryConfig, snapshot_id: int | None, after: int, events: Sequence[StoredEvent]
) -> EventsCommitted:
    """Append `events` (the feed after `after`) to run_events in one commit, conditional on no rows having
    been added since `snapshot_id` (None: since the table was created), with the position reached."""
    from pyspark.sql.functions import col

    started = time.perf_counter()
    ident, reached = config.events_table, events[-1].position
    frame = arrow_frame(spark, events_to_arrow(events), EVENT_DDL)
    writer = (
        frame.writeTo(ident)
        .option(f"snapshot-property.{POSITION_PROPERTY}", str(reached))
        .option("isolation-level", "serializable")
    )
    if snapshot_id is not None:
        writer = writer.option("validate-from-snapshot-id", str(snapshot_id))
    with spark_errors(ident, "append to"):
        writer.overwrite(col("position") > after)
    runs = len({event.run_id for event in events})
    return EventsCommitted(ident, after, reached, len(events), runs, time.perf_counter() - started)


def export_history(
    spark: Any, feed: Any, config: HistoryConfig, *, once: bool = False
) -> Iterator[ExportStep]:
    """Export the feed after the table's position, a batch per commit, until the feed is read to its end
    (`once`: one batch), merging runs after each commit; yields each commit as it lands."""
    check_feed(feed)
    ensure_tables(spark, config)
    while True:
        snapshot_id, after = events_position(spark, config)
        events = read_batch(feed, after, config.batch_events)
        batch = None
        if events:
            yield commit_events(spark, config, snapshot_id, after, events)
            batch = (after, events)
        while (merged := merge_runs(spark, config, batch)) is not None:
            yield merged
            batch = None
        if once or len(events) < config.batch_events:
            return
