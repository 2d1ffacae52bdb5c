"""The `run_snapshots` asset: the projected state of every run, partitioned by the day the run started.

Design (incremental projection AND day-partitioned backfills, one asset):
- The asset is partitioned daily (UTC) by each run's start day. Materializing a day projects the
  runs that started that day.
- A normal run of a partition is incremental: `project()` applies only the events above each run's
  stored watermark, so a run without new events costs one read and its version does not move.
  `run_snapshots_sensor` finds the runs with new events (the core's `stale_runs_with_start`), maps
  them to their start days and requests exactly those partitions; that is "project every run with
  new events" without a full scan. Metadata: runs projected, runs changed, events applied.
- A backfill is a full rebuild: in a run that belongs to a backfill (Dagster tags it
  `dagster/backfill`) each run of the day is folded from scratch with `rebuild()`, which gives the
  same result as the incremental path (the core guarantees it). `BackfillPolicy.single_run()` lets a
  multi-day backfill rebuild its whole time window in one run. The `rebuild` config overrides the
  choice either way (e.g. a one-day rebuild from the launchpad).
- Partitions start on 2025-01-01 and end tomorrow (UTC, clock skew); a run that started outside that
  range is logged by the sensor and left to `runstate events project`.
"""

import warnings
from datetime import datetime, timedelta
from typing import Any

import dagster as dg
from pydantic import Field

from runstate.defs.eventstore.jobs import RUN_EVENTS_ASSET, STORE_RETRY_POLICY
from runstate.defs.eventstore.resources import EventStoreResource
from runstate.defs.runs.interrupts import ends_run_when_interrupted
from runstate.defs.tags import DOMAIN_TAG, TABLE_TAG
from runstate.eventstore import ProjectionReport

# single_run backfills are what we want; the beta notice would print on every CLI call and test.
warnings.filterwarnings("ignore", message="Parameter `backfill_policy`", category=dg.BetaWarning)

RUN_START_DAYS = dg.DailyPartitionsDefinition(start_date="2025-01-01", timezone="UTC", end_offset=1)
# run_snapshots_sensor projects runs with new events every minute: ten minutes without a projection is late
# while engines write, an hour is behind (a quiet event store, with no new events, reads the same).
RUN_SNAPSHOTS_FRESHNESS = dg.FreshnessPolicy.time_window(
    fail_window=timedelta(hours=1), warn_window=timedelta(minutes=10)
)
BACKFILL_TAG = "dagster/backfill"

run_events = dg.AssetSpec(
    RUN_EVENTS_ASSET,
    group_name="eventstore",
    description="The append-only run event log (run_events), written by engines and the append_events job.",
)


class RunSnapshotsConfig(dg.Config):
    rebuild: bool | None = Field(
        default=None,
        description=(
            "Fold every run of the window from scratch. Default: only when the run is part of a backfill."
        ),
    )


def wants_rebuild(context: dg.AssetExecutionContext, config: RunSnapshotsConfig) -> bool:
    if config.rebuild is not None:
        return config.rebuild
    return context.run.tags.get(BACKFILL_TAG) is not None


def project_window(store: Any, start: datetime, end: datetime, rebuild: bool) -> ProjectionReport:
    """Project (or rebuild) every run that started in [start, end)."""
    return store.project_runs(store.runs_started_between(start, end), rebuild=rebuild)


@dg.asset(
    partitions_def=RUN_START_DAYS,
    deps=[run_events],
    group_name="eventstore",
    backfill_policy=dg.BackfillPolicy.single_run(),
    freshness_policy=RUN_SNAPSHOTS_FRESHNESS,
    retry_policy=STORE_RETRY_POLICY,
    op_tags={TABLE_TAG: "run_snapshots"},
    description="Projected state of each run (status, steps, artifacts), by the UTC day the run started.",
)
@ends_run_when_interrupted
def run_snapshots(
    context: dg.AssetExecutionContext, config: RunSnapshotsConfig, event_store: EventStoreResource
) -> dg.MaterializeResult:
    window = context.partition_time_window
    rebuild = wants_rebuild(context, config)
    report = project_window(event_store.get_store(), window.start, window.end, rebuild)
    context.log.info(
        f"{'rebuilt' if rebuild else 'projected'} {report.runs_projected} run(s) started in "
        f"[{window.start:%Y-%m-%d}, {window.end:%Y-%m-%d}): {report.runs_changed} changed, "
        f"{report.events_applied} event(s) applied"
    )
    for run_id, error in report.failed:  # isolated: the other runs of the window are projected
        context.log.warning(f"run {run_id!r} not projected: {error}")
    # A multi-day (single-run) backfill reports the window's totals on each day's materialization.
    return dg.MaterializeResult(
        metadata={
            "mode": "rebuild" if rebuild else "incremental",
            "window_start": window.start.isoformat(),
            "window_end": window.end.isoformat(),
            "runs_projected": report.runs_projected,
            "runs_changed": report.runs_changed,
            "events_applied": report.events_applied,
            "runs_failed": len(report.failed),
            "failed_run_ids": ", ".join(run_id for run_id, _ in report.failed[:20]),
        }
    )


run_snapshots_job = dg.define_asset_job(
    "run_snapshots_job",
    selection=[run_snapshots],
    tags={DOMAIN_TAG: "eventstore"},
    description=(
        "Project the runs of one start day into run_snapshots (a backfill rebuilds them from scratch)."
    ),
)
EXPORT_JOB = "export_run_history"
# The jobs that keep the store's own tables: projections and the run history in the lake. run_recorder
# records their runs like any other, so their events alone start none of them: an export's events made
# its run stale, whose projection run's events made an export due, one run of each a minute for ever.
BOOKKEEPING_JOBS = frozenset({run_snapshots_job.name, EXPORT_JOB})
