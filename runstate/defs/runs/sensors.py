"""`run_recorder`: every Dagster run of this deployment is recorded in the run state store.
`run_liveness`: every run of this code location that is in progress and dead is failed."""

from __future__ import annotations

import json

import dagster as dg

from runstate.defs.eventstore.resources import EventStoreResource
from runstate.defs.runs.liveness import IN_PROGRESS_STATUSES, check_runs, sweep_rows
from runstate.defs.runs.recording import record_runs, run_ids_with_status_changes

BATCH = 200
# A dead run holds its shard (and Spark slot) until this sensor or a shard sensor looks: a few ticks of
# the bound are enough, each tick one query of the runs in progress and one of their heartbeats.
LIVENESS_INTERVAL_S = 10


@dg.sensor(
    minimum_interval_seconds=15,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Tails the Dagster event log for run status changes and appends each run's canonical "
    "events (RunStarted, StepStarted, StepCompleted/StepFailed with attempts, RunCompleted/RunFailed/"
    "RunCancelled) to the run state store. The cursor holds one event-log position per run status.",
)
def run_recorder(context: dg.SensorEvaluationContext, event_store: EventStoreResource) -> dg.SkipReason:
    cursors = json.loads(context.cursor or "{}")
    run_ids, new_cursors = run_ids_with_status_changes(context.instance, cursors, BATCH)
    if not run_ids:
        return dg.SkipReason("no run status changes since the last tick")
    persisted = record_runs(context.instance, event_store.get_store(), run_ids)
    context.update_cursor(json.dumps(new_cursors, sort_keys=True))
    return dg.SkipReason(f"recorded {len(run_ids)} run(s), {sum(persisted.values())} new event(s)")


@dg.sensor(
    minimum_interval_seconds=LIVENESS_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Judges every run of this code location that is in progress (launching, started or "
    "canceling) by its heartbeat, and reports the dead ones failed, so they free their shards and slots "
    "in any instance, run monitoring or not; then drops the heartbeat rows of runs that ended.",
)
def run_liveness(context: dg.SensorEvaluationContext) -> dg.SkipReason:
    jobs = set(context.repository_def.job_names) if context.repository_def is not None else None
    records = [
        record
        for record in context.instance.get_run_records(dg.RunsFilter(statuses=list(IN_PROGRESS_STATUSES)))
        if jobs is None or record.dagster_run.job_name in jobs
    ]
    verdicts = check_runs(context.instance, records)
    reaped = [verdict for verdict in verdicts if verdict.reason]
    swept = sweep_rows(context.instance)
    for verdict in reaped:
        context.log.warning(f"{verdict.describe()}: failed, {verdict.reason}")
    return dg.SkipReason(
        f"{len(records)} run(s) in progress, {len(reaped)} found dead and failed"
        + (f": {', '.join(v.run_id for v in reaped)}" if reaped else "")
        + f"; heartbeat rows of {swept} ended run(s) dropped"
    )
