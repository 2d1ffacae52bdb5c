"""`wal_compaction_schedule` (daily, one compaction run per dataset) and the WAL lag check's schedule."""

import dagster as dg

from runstate.defs.wal.checks import wal_lag_job
from runstate.defs.wal.jobs import compact_wal, compaction_run_request
from runstate.defs.wal.resources import WalResource
from runstate.wal import wal_status


@dg.schedule(
    job=compact_wal,
    cron_schedule="0 3 * * *",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Daily at 03:00 UTC: one compact_wal run per dataset, tagged so it never overlaps a flush.",
)
def wal_compaction_schedule(context: dg.ScheduleEvaluationContext, wal: WalResource):
    day = context.scheduled_execution_time.strftime("%Y-%m-%d")
    datasets = [status.dataset_id for status in wal_status(wal.dynamodb_client(), wal.table_name)]
    if not datasets:
        return dg.SkipReason("no datasets in the WAL")
    return [compaction_run_request(dataset_id, day) for dataset_id in datasets]


wal_lag_schedule = dg.ScheduleDefinition(
    name="wal_lag_schedule",
    job=wal_lag_job,
    cron_schedule="*/10 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Evaluate the wal_lag check every 10 minutes.",
)
