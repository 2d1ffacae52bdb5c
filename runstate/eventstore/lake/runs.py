"""`lake.<namespace>.runs`: one row per run, the store's projection of it, merged inside Spark.

A row is the run as of its last exported event: when the store first saw the run (`created_at`, its
stream's creation, which never changes), the projection's status, start and completion, its first and
last event time, how many events it has, the steps whose last attempt failed, its last seq, the position
of its last event (`last_position`), each step's last status (`steps`) and what a later merge combines
onto (`fold_state`). The projection is written as aggregates that combine in any order
(sql/spark/eventstore/runs.sql says which), so a merge folds a range of run_events onto the stored rows
in Spark: no event crosses into Python. The table is partitioned by day of `created_at`, which the merge
asks the store for, and its reads and its MERGE name the days of the runs they touch (tables.created_days):
an export's cost follows the runs it touches, not the table's size.

Why a merge is exactly-once even when it is killed, repeated or raced by another export:
- a merge covers one range of the feed, (the table's position, end], read from run_events; a run's row is
  the fold of every event of the run up to its `last_position`, so the merge combines a stored row with
  its run's events above that position only: a range merged again adds nothing to it;
- a row only replaces a stored row whose `last_position` is lower (as the dataset tables' newer
  `wal_seq` wins), so writing a row twice, or an older row after a newer one, changes nothing;
- the rows commit together, and the table's position is their largest `last_position`: a merge
  killed before its commit leaves the position where it was, and the next export merges the range again.
  (The position is read from a table property set after the commit; if a merge dies between the two, the
  property lags, and the next merge's range holds events some rows have: the rule above skips them.)
- the combination is by seq, not by arrival: a run whose events commit out of seq order (two appends
  whose feed positions crossed) gets the row the projection gives for all its events.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from runstate.eventstore.lake.arrow import arrow_frame, collect_arrow
from runstate.eventstore.lake.config import HistoryConfig
from runstate.eventstore.lake.errors import HistoryError
from runstate.eventstore.lake.tables import (
    created_days,
    events_position,
    record_runs_position,
    runs_position,
    spark_errors,
)
from runstate.sqlfiles import named

_sql = named("spark", "eventstore", "runs.sql")
_CREATED_COLUMNS = (("run_id", "STRING NOT NULL"), ("created_at", "TIMESTAMP NOT NULL"))


@dataclass(frozen=True)
class RunsMerged:
    """One merge into the runs table: it went from `from_position` to `position`."""

    table: str
    from_position: int
    position: int
    runs: int
    seconds: float

    def describe(self) -> str:
        return (
            f"{self.runs} run(s) merged into {self.table} up to position {self.position} "
            f"in {self.seconds:.1f} s"
        )


def merge_runs(spark: Any, feed: Any, config: HistoryConfig) -> RunsMerged | None:
    """Merge run_events after the runs table's position into runs, in one commit; None when runs has
    reached run_events. `feed` is the store the events came from: it says when each run was created."""
    started = time.perf_counter()
    snapshot_id, reached = events_position(spark, config)
    start = runs_position(spark, config)
    if start >= reached:
        return None
    bounds = {"after": start, "upto": reached}
    names = {"events": config.events_table, "runs": config.runs_table, "snapshot_id": int(snapshot_id)}
    with spark_errors(config.events_table, "read"):
        touched = collect_arrow(spark.sql(_sql("touched_runs").format(**names), args=bounds))
    run_ids = touched.column("run_id").to_pylist()
    if not run_ids:
        raise HistoryError(
            f"{config.events_table} records a position above {start} but holds no event after it: "
            "its rows or its snapshot summaries were changed outside the export"
        )
    created = _created_at(feed, config, run_ids)
    days, day_params = created_days(
        created.values(), "t.created_at"
    )  # `t`: the runs table in both statements
    with _view(spark, _created_frame(spark, created)) as created_view:
        query = _sql("merged_rows").format(**names, created=created_view, days=days)
        with spark_errors(config.runs_table, "merge into"):
            rows = spark.sql(query, args={**bounds, **day_params})
            with _view(spark, rows) as source:
                spark.sql(_sql("merge").format(**names, source=source, days=days), args=day_params)
    record_runs_position(spark, config, reached)
    return RunsMerged(config.runs_table, start, reached, len(run_ids), time.perf_counter() - started)


def _created_at(feed: Any, config: HistoryConfig, run_ids: list[str]) -> dict[str, datetime]:
    """When the store created each run; a HistoryError when it knows one of them not (its stream rows
    were deleted by hand: the runs table could not tell where such a run's row is)."""
    created = feed.runs_created_at(run_ids)
    if missing := sorted(set(run_ids) - created.keys()):
        raise HistoryError(
            f"{config.events_table} holds events of {len(missing)} run(s) the event store has no stream for, "
            f"such as {missing[0]!r}: was run_streams changed by hand?"
        )
    return created


def _created_frame(spark: Any, created: dict[str, datetime]) -> Any:
    """The runs' creation times as a DataFrame (run_id, created_at), sent in Arrow batches."""
    import pyarrow as pa

    table = pa.table(
        {
            "run_id": pa.array(list(created), pa.string()),
            "created_at": pa.array(list(created.values()), pa.timestamp("us", tz="UTC")),
        }
    )
    return arrow_frame(spark, table, _CREATED_COLUMNS)


@contextmanager
def _view(spark: Any, frame: Any) -> Iterator[str]:
    """`frame` as a temporary view of a name of its own, dropped afterwards."""
    name = f"runstate_runs_{uuid.uuid4().hex}"
    frame.createOrReplaceTempView(name)
    try:
        yield name
    finally:
        spark.catalog.dropTempView(name)
