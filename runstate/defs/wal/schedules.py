"""`wal_compaction_schedule`: daily, one compaction run per flush shard (the wal_lag check runs by its
AutomationCondition)."""

import dagster as dg

from runstate.defs.wal.jobs import compact_wal, compaction_run_request
from runstate.defs.wal.resources import WalResource
from runstate.wal.shards import shard_of


@dg.schedule(
    job=compact_wal,
    cron_schedule="10 3 * * *",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Daily at 03:10 UTC: one compact_wal run per flush shard, tagged so it never overlaps its flushes.",
)
def wal_compaction_schedule(context: dg.ScheduleEvaluationContext, wal: WalResource):
    day = context.scheduled_execution_time.strftime("%Y-%m-%d")
    by_shard: dict[int, list[str]] = {}
    for dataset_id in wal.wal_table().metas():
        by_shard.setdefault(shard_of(dataset_id, wal.flush_shards), []).append(dataset_id)
    if not by_shard:
        return dg.SkipReason("no datasets in the WAL")
    return [compaction_run_request(shard, datasets, day) for shard, datasets in sorted(by_shard.items())]
