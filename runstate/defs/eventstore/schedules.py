"""The daily archival schedule: runs `archive_events` for runs completed more than N days ago."""

import dagster as dg

from runstate.defs.eventstore.jobs import DEFAULT_ARCHIVE_AFTER_DAYS, archive_events
from runstate.defs.tags import SCHEDULED_DAY_TAG


@dg.schedule(
    job=archive_events,
    cron_schedule="40 3 * * *",
    execution_timezone="UTC",
    description=(
        f"Daily: archive the events of runs completed more than {DEFAULT_ARCHIVE_AFTER_DAYS} days ago."
    ),
)
def archive_events_schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    day = context.scheduled_execution_time.strftime("%Y-%m-%d")
    # One archival per scheduled day: the run_key dedupes a re-evaluated tick.
    return dg.RunRequest(
        run_key=f"archive_events:{day}",
        run_config={
            "ops": {"archive_events_op": {"config": {"older_than_days": DEFAULT_ARCHIVE_AFTER_DAYS}}}
        },
        tags={SCHEDULED_DAY_TAG: day},
    )
