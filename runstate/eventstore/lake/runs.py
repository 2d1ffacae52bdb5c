"""`lake.<namespace>.runs`: one row per run, folded from its events by the store's own projection.

A row is the run as of its last exported event: when the store first saw the run (`created_at`, its
stream's creation, which never changes), the projection's status, start and completion, its first and
last event time, how many events it has, the steps whose last attempt failed, its last seq,
the position of its last event (`last_position`) and the projection itself (`snapshot`, the JSON that
`RunSnapshot.to_dict()` gives). A merge reads its range of run_events back in Arrow batches, folds each
run's new events onto its stored row in the driver (the store's own projection), and MERGEs the rows
in one commit. The table is partitioned by day of `created_at`, which the merge asks the store for, and
its reads and its MERGE name the days of the runs they touch (tables.created_days): an export's cost
follows the runs it touches, not the table's size.

Why a merge is exactly-once even when it is killed, repeated or raced by another export:
- a merge covers one range of the feed, (the table's position, end], read from run_events: a run's row
  is the fold of every event of the run up to its `last_position`, whatever merge wrote it;
- a row only replaces a stored row whose `last_position` is lower (as the dataset tables' newer
  `wal_seq` wins), so writing a row twice, or an older row after a newer one, changes nothing;
- the rows commit together, and the table's position is their largest `last_position`: a merge
  killed before its commit leaves the position where it was, and the next export merges the range again.
  (The position is read from a table property set after the commit; if a merge dies between the two, the
  property lags, and the next merge's range holds events some rows have: those runs are folded again.)
A run's events usually come in seq order; one whose new events are not all after its stored last seq
(two appends whose feed positions crossed) is folded again from all its events in run_events, read from
the partitions of the days between its earliest and its latest event only.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from runstate.eventstore.contract import RunSnapshot
from runstate.eventstore.lake.arrow import (
    RUNS_COLUMNS,
    arrow_frame,
    arrow_schema,
    collect_arrow,
    collector_paused,
    python_values,
    rows_from_arrow,
    utc,
)
from runstate.eventstore.lake.config import HistoryConfig
from runstate.eventstore.lake.errors import HistoryError
from runstate.eventstore.lake.tables import (
    created_days,
    events_position,
    record_runs_position,
    runs_position,
    spark_errors,
)
from runstate.eventstore.projection import READS_DATA, FoldedEvent, fold

if TYPE_CHECKING:
    import pyarrow as pa


class FoldedRunEvent(FoldedEvent, Protocol):
    """An event a run's row is folded from: the fold's fields, its run and its feed position."""

    @property
    def run_id(self) -> str: ...
    @property
    def position(self) -> int | None: ...


class RunEvent(NamedTuple):
    """What a run's row is folded from: the columns of run_events that the projection and the row read
    (a StoredEvent has them too). `data` is decoded only for the event types whose fold reads it
    (projection.READS_DATA), None for the rest, as the append path's hints do."""

    run_id: str
    run_seq: int
    event_type: str
    step_id: str | None
    emitted_at: datetime
    data: Any
    position: int


# The columns a merge reads back, in RunEvent's order; the payload only where the fold reads it (the
# event types are the projection's constants).
_READS_DATA_SQL = ", ".join(f"'{event_type}'" for event_type in sorted(READS_DATA))
_RUN_EVENT_SELECT = (
    "run_id, run_seq, event_type, step_id, emitted_at, "
    f"CASE WHEN event_type IN ({_READS_DATA_SQL}) THEN event_data END AS event_data, position"
)


def run_events_from_arrow(table: pa.Table) -> list[RunEvent]:
    """RunEvents from an Arrow table of _RUN_EVENT_SELECT's columns."""
    with collector_paused():
        columns = [python_values(column) for column in table.columns]
        columns[5] = [None if text is None else json.loads(text) for text in columns[5]]
        return list(map(RunEvent._make, zip(*columns, strict=True)))


@dataclass(frozen=True)
class RunRow:
    """One row of the runs table."""

    snapshot: RunSnapshot
    created_at: datetime
    first_event_at: datetime
    last_event_at: datetime
    event_count: int
    last_position: int

    @property
    def run_id(self) -> str:
        return self.snapshot.run_id

    @property
    def failed_steps(self) -> list[str]:
        return sorted(step for step, state in self.snapshot.steps.items() if state.status == "FAILED")

    def columns(self) -> dict[str, Any]:
        snap = self.snapshot
        return {
            "run_id": snap.run_id,
            "created_at": self.created_at,
            "status": snap.status,
            "started_at": snap.started_at,
            "completed_at": snap.completed_at,
            "first_event_at": self.first_event_at,
            "last_event_at": self.last_event_at,
            "duration_s": (self.last_event_at - self.first_event_at).total_seconds(),
            "event_count": self.event_count,
            "failed_steps": self.failed_steps,
            "last_seq": snap.last_event_seq,
            "last_position": self.last_position,
            "snapshot": json.dumps(snap.to_dict(), sort_keys=True, separators=(",", ":")),
        }

    @classmethod
    def from_columns(cls, row: dict[str, Any]) -> RunRow:
        return cls(
            snapshot=RunSnapshot.from_dict(json.loads(row["snapshot"])),
            created_at=utc(row["created_at"]),
            first_event_at=utc(row["first_event_at"]),
            last_event_at=utc(row["last_event_at"]),
            event_count=int(row["event_count"]),
            last_position=int(row["last_position"]),
        )

    @classmethod
    def of(cls, run_id: str, created_at: datetime, events: Sequence[FoldedRunEvent]) -> RunRow:
        """The row of a run from all its events (in seq order)."""
        return cls.fold_onto(None, run_id, created_at, events)

    @classmethod
    def fold_onto(
        cls, row: RunRow | None, run_id: str, created_at: datetime, events: Sequence[FoldedRunEvent]
    ) -> RunRow:
        """`row` advanced by `events` (seq order, every seq above the row's last seq)."""
        times = [utc(event.emitted_at) for event in events]
        base = row.snapshot if row else RunSnapshot.empty(run_id)
        return cls(
            snapshot=fold(base, events),
            created_at=utc(created_at),
            first_event_at=min([row.first_event_at, *times] if row else times),
            last_event_at=max([row.last_event_at, *times] if row else times),
            event_count=(row.event_count if row else 0) + len(events),
            last_position=max(event.position for event in events),
        )


def by_run(events: Iterable[FoldedRunEvent]) -> dict[str, list[FoldedRunEvent]]:
    """Each run's events in seq order."""
    runs: dict[str, list[FoldedRunEvent]] = defaultdict(list)
    for event in events:
        runs[event.run_id].append(event)
    return {run_id: sorted(run, key=lambda e: e.run_seq) for run_id, run in runs.items()}


def plan_rows(
    stored: dict[str, RunRow], new: dict[str, list[FoldedRunEvent]], created: dict[str, datetime]
) -> tuple[list[RunRow], list[str]]:
    """The rows folded from the stored ones, and the runs to fold again from all their events: those
    whose new events do not all come after their stored last seq."""
    rows, again = [], []
    for run_id, events in new.items():
        row = stored.get(run_id)
        if row is not None and events[0].run_seq <= row.snapshot.last_event_seq:
            again.append(run_id)
        else:
            rows.append(RunRow.fold_onto(row, run_id, created[run_id], events))
    return rows, again


@dataclass(frozen=True)
class RunsMerged:
    """One merge into the runs table: it went from `from_position` to `position`."""

    table: str
    from_position: int
    position: int
    runs: int
    folded_again: int
    seconds: float

    def describe(self) -> str:
        again = f" ({self.folded_again} folded again from all their events)" if self.folded_again else ""
        return (
            f"{self.runs} run(s){again} merged into {self.table} up to position {self.position} "
            f"in {self.seconds:.1f} s"
        )


def merge_runs(
    spark: Any, feed: Any, config: HistoryConfig, committed: Sequence[tuple[int, int]] = ()
) -> RunsMerged | None:
    """Merge run_events after the runs table's position into runs, in one commit; None when runs has
    reached run_events.

    The range is read a chunk of at most `batch_events` events at a time, each run's new events folded
    onto its row (the stored one, read once, or the one this merge has folded so far), so an export that
    committed several batches merges them in one MERGE. `committed` holds the (after, upto) positions of
    those batches: a chunk that is one of them is read by its bounds, without a sort. A merge stops early
    once it holds `batch_events` runs' rows. `feed` is the store the events came from: it says when each
    run was created."""
    started = time.perf_counter()
    snapshot_id, reached = events_position(spark, config)
    start = position = runs_position(spark, config)
    if position >= reached:
        return None
    bounds = dict(committed)
    folded: dict[str, RunRow] = {}
    created: dict[str, datetime] = {}
    folded_again = 0
    while position < reached and len(folded) < config.batch_events:
        events, end = _next_chunk(spark, config, snapshot_id, position, bounds.get(position))
        new = by_run(events)
        unseen = [run_id for run_id in new if run_id not in folded]
        if unseen:
            created.update(_created_at(feed, config, unseen))
        if start and unseen:
            folded.update(_stored_rows(spark, config, {run_id: created[run_id] for run_id in unseen}))
        rows, again = plan_rows(folded, new, created)
        if again:
            span = _emitted_span([folded[run_id] for run_id in again], [new[run_id] for run_id in again])
            full = by_run(_events_of_runs(spark, config, snapshot_id, again, end, span))
            rows += [RunRow.of(run_id, created[run_id], full[run_id]) for run_id in again]
            folded_again += len(again)
        folded.update((row.run_id, row) for row in rows)
        position = end
    merge_rows(spark, config, list(folded.values()))
    record_runs_position(spark, config, position)
    return RunsMerged(
        config.runs_table, start, position, len(folded), folded_again, time.perf_counter() - started
    )


def _next_chunk(
    spark: Any, config: HistoryConfig, snapshot_id: int, position: int, upto: int | None
) -> tuple[list[RunEvent], int]:
    """The exported events after `position` up to `upto` when that is known, else the next
    `batch_events` of them in position order; and the position they reach."""
    if upto is not None:
        where = f"position > {int(position)} AND position <= {int(upto)}"
    else:
        where = f"position > {int(position)} ORDER BY position LIMIT {int(config.batch_events)}"
    query = f"SELECT {_RUN_EVENT_SELECT} FROM {config.events_table} VERSION AS OF {snapshot_id} WHERE {where}"
    with spark_errors(config.events_table, "read"):
        events = run_events_from_arrow(collect_arrow(spark.sql(query)))
    if not events:
        raise HistoryError(
            f"{config.events_table} records a position above {position} but holds no event after it: "
            "its rows or its snapshot summaries were changed outside the export"
        )
    return events, upto if upto is not None else events[-1].position


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


def _ids_view(spark: Any, run_ids: list[str]) -> str:
    view = f"runstate_run_ids_{uuid.uuid4().hex}"
    spark.createDataFrame([(run_id,) for run_id in run_ids], "run_id STRING").createOrReplaceTempView(view)
    return view


def _stored_rows(spark: Any, config: HistoryConfig, created: dict[str, datetime]) -> dict[str, RunRow]:
    """The stored rows of the runs `created` names, read from the partitions of their creation days."""
    view = _ids_view(spark, list(created))
    days, params = created_days(created.values(), "r.created_at")
    query = (
        f"SELECT r.* FROM {config.runs_table} r LEFT SEMI JOIN {view} i ON r.run_id = i.run_id WHERE {days}"
    )
    try:
        with spark_errors(config.runs_table, "read"):
            rows = rows_from_arrow(collect_arrow(spark.sql(query, args=params)))
        return {row["run_id"]: RunRow.from_columns(row) for row in rows}
    finally:
        spark.catalog.dropTempView(view)


def _emitted_span(
    rows: Sequence[RunRow], chunks: Sequence[Sequence[FoldedRunEvent]]
) -> tuple[datetime, datetime]:
    """When the earliest and the latest event of these runs up to this chunk were emitted: their rows hold
    the span of every event folded so far, the chunks the rest."""
    times = [utc(event.emitted_at) for chunk in chunks for event in chunk]
    earliest = min(row.first_event_at for row in rows)
    latest = max(row.last_event_at for row in rows)
    return min(earliest, *times), max(latest, *times)


def _events_of_runs(
    spark: Any,
    config: HistoryConfig,
    snapshot_id: int,
    run_ids: list[str],
    end: int,
    span: tuple[datetime, datetime],
) -> list[RunEvent]:
    """Every event of the runs up to position `end`, read from the partitions of `span` only (run_events
    is partitioned by day of emitted_at)."""
    view = _ids_view(spark, run_ids)
    query = (
        f"SELECT {_RUN_EVENT_SELECT} FROM {config.events_table} VERSION AS OF {snapshot_id} e "
        f"LEFT SEMI JOIN {view} i ON e.run_id = i.run_id WHERE position <= {int(end)} "
        "AND e.emitted_at >= :earliest AND e.emitted_at <= :latest"
    )
    try:
        with spark_errors(config.events_table, "read"):
            rows = spark.sql(query, args={"earliest": span[0], "latest": span[1]})
            return run_events_from_arrow(collect_arrow(rows))
    finally:
        spark.catalog.dropTempView(view)


def merge_rows(spark: Any, config: HistoryConfig, rows: list[RunRow]) -> None:
    """One MERGE: a row replaces a stored one only when its last_position is higher. It reads the
    partitions of the rows' creation days only."""
    import pyarrow as pa

    table = pa.Table.from_pylist([row.columns() for row in rows], schema=arrow_schema(RUNS_COLUMNS))
    view = f"runstate_runs_{uuid.uuid4().hex}"
    arrow_frame(spark, table, RUNS_COLUMNS).createOrReplaceTempView(view)
    days, params = created_days((row.created_at for row in rows), "t.created_at")
    try:
        with spark_errors(config.runs_table, "merge into"):
            spark.sql(
                f"MERGE INTO {config.runs_table} t USING {view} s ON t.run_id = s.run_id AND {days} "
                "WHEN MATCHED AND s.last_position > t.last_position THEN UPDATE SET * "
                "WHEN NOT MATCHED THEN INSERT *",
                args=params,
            )
    finally:
        spark.catalog.dropTempView(view)
