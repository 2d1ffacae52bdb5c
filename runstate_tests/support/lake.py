"""The run history's lake, for its tests: random feeds, exports run to the feed's end, and what the lake
holds read back and compared with the feed."""

from __future__ import annotations

import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from runstate.eventstore import CANONICAL_EVENT_TYPES, NewEvent, StoredEvent, fold
from runstate.eventstore.contract import RunSnapshot
from runstate.eventstore.lake import HistoryConfig, export_history
from runstate.eventstore.lake.arrow import collect_arrow, events_from_arrow, python_values
from runstate.eventstore.lake.tables import events_position

T0 = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
SMALL_BATCHES = 40
STEPS = ("extract", "load", None)


def random_batch(rng: random.Random, run_id: str, start: int) -> list[NewEvent]:
    """1 to 4 events of canonical (and one unknown) types, on a few steps, over a few days."""
    types = sorted(CANONICAL_EVENT_TYPES) + ["CustomNote"]
    batch = []
    for n in range(rng.randint(1, 4)):
        kind = rng.choice(types)
        batch.append(
            NewEvent(
                run_id=run_id,
                event_type=kind,
                emitted_at=T0 + timedelta(hours=rng.randint(0, 72), seconds=start + n),
                step_id=rng.choice(STEPS),
                data=rng.choice(
                    [None, {"error": f"e{rng.randint(0, 9)}"}, {"rows": rng.randint(0, 99)}, [1, "x"]]
                ),
                idempotency_key=uuid.uuid4().hex,
            )
        )
    return batch


def append_randomly(store: Any, rng: random.Random, runs: int, appends: int) -> None:
    for n in range(appends):
        run_id = f"run-{rng.randrange(runs):02d}"
        store.append_batch(run_id, random_batch(rng, run_id, n))


def feed_from_start(store: Any, page: int = 1000) -> list[StoredEvent]:
    events: list[StoredEvent] = []
    while True:
        chunk = store.fetch_all(events[-1].position if events else 0, page)
        events += chunk
        if len(chunk) < page:
            return events


def lake_events(spark: Any, config: HistoryConfig) -> list[StoredEvent]:
    return events_from_arrow(
        collect_arrow(spark.sql(f"SELECT * FROM {config.events_table} ORDER BY position"))
    )


def rows_from_arrow(table: Any) -> list[dict[str, Any]]:
    """The rows of an Arrow table as dicts."""
    columns = {name: python_values(table.column(name)) for name in table.column_names}
    return [dict(zip(columns, row, strict=True)) for row in zip(*columns.values(), strict=True)]


def lake_runs(spark: Any, config: HistoryConfig, where: str = "true") -> dict[str, dict[str, Any]]:
    """The runs table's rows (`where` holds) as stored, column for column (timestamps as UTC datetimes,
    `steps` as a dict), but `fold_state`: what a later merge combines onto, checked by the rows later
    merges give."""
    rows = rows_from_arrow(collect_arrow(spark.sql(f"SELECT * FROM {config.runs_table} WHERE {where}")))
    runs = {}
    for columns in rows:
        columns["steps"] = dict(columns["steps"])
        del columns["fold_state"]
        runs[columns["run_id"]] = columns
    assert len(runs) == len(rows), "one row per run"
    return runs


STEP_EVENT_TYPES = frozenset({"StepStarted", "StepCompleted", "StepFailed", "StepRetrying"})


def expected_steps(projected: RunSnapshot, run: list[StoredEvent]) -> dict[str, dict[str, Any]]:
    """Each step's status (the projection's), how many times it started and the seq of its last step
    event."""
    starts: dict[str, int] = {}
    last: dict[str, int] = {}
    for event in run:
        if event.event_type in STEP_EVENT_TYPES:
            step = event.step_id or ""
            starts[step] = starts.get(step, 0) + (event.event_type == "StepStarted")
            last[step] = max(last.get(step, 0), event.run_seq)
    assert last.keys() == projected.steps.keys()
    return {
        step: {"status": state.status, "starts": starts[step], "seq": last[step]}
        for step, state in projected.steps.items()
    }


def expected_runs(store: Any, events: list[StoredEvent]) -> dict[str, dict[str, Any]]:
    """What `runs` must hold, from the feed and the store's own projection (`fold` of each run's events in
    seq order, as `project()` gives from scratch), not the exporter."""
    by_run: dict[str, list[StoredEvent]] = {}
    for event in events:
        by_run.setdefault(event.run_id, []).append(event)
    expected = {}
    created = store.runs_created_at(list(by_run))
    for run_id, run in by_run.items():
        projected = fold(RunSnapshot.empty(run_id), sorted(run, key=lambda event: event.run_seq))
        first, last = min(e.emitted_at for e in run), max(e.emitted_at for e in run)
        expected[run_id] = {
            "run_id": run_id,
            "created_at": created[run_id],
            "status": projected.status,
            "started_at": projected.started_at,
            "completed_at": projected.completed_at,
            "first_event_at": first,
            "last_event_at": last,
            "duration_s": (last - first).total_seconds(),
            "event_count": len(run),
            "failed_steps": sorted(s for s, step in projected.steps.items() if step.status == "FAILED"),
            "last_seq": max(e.run_seq for e in run),
            "last_position": max(e.position for e in run),
            "steps": expected_steps(projected, run),
        }
    return expected


# A feed read returns only what no transaction still in progress can precede: on a busy machine a read
# may stop short for a moment (it never skips), so an export may end before events committed earlier.
FEED_SETTLE_TRIES = 20


def exported_to_the_end(spark: Any, store: Any, config: HistoryConfig, **options: Any) -> list[Any]:
    """The steps of export_history, run again while the lake is behind the feed as read after it."""
    steps: list[Any] = []
    for _ in range(FEED_SETTLE_TRIES):
        steps += export_history(spark, store, config, **options)
        feed = feed_from_start(store)
        if not feed or events_position(spark, config)[1] >= feed[-1].position:
            return steps
        time.sleep(0.5)
    raise AssertionError(f"the export never reached the feed's end ({feed[-1].position})")


def assert_lake_equals_feed(spark: Any, store: Any, config: HistoryConfig) -> list[StoredEvent]:
    """run_events equals fetch_all from 0, row for row, and runs equals the aggregate of the feed."""
    lake = lake_events(spark, config)
    for _ in range(FEED_SETTLE_TRIES):
        feed = feed_from_start(store)
        if len(feed) >= len(lake):
            break
        time.sleep(0.5)
    assert lake == feed
    assert lake_runs(spark, config) == expected_runs(store, feed)
    return feed
