"""`run_recorder`: every Dagster run of this deployment is recorded in the run state store."""

from __future__ import annotations

import json

import dagster as dg

from runstate.defs.eventstore.resources import EventStoreResource
from runstate.defs.runs.recording import record_runs, run_ids_with_status_changes

BATCH = 200


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
