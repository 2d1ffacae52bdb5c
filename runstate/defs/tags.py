"""Every `runstate/...` run and op tag the deployment writes, and the Dagster pool, in one place.

dagster.yaml's `concurrency: runs: tag_concurrency_limits` key on three of these (`WAL_SHARD_TAG`,
`TABLE_TAG`, `MERGE_SHARD_TAG`: one in-progress run per value), so renaming one here means renaming it
there too. The Spark cap is the pool `SPARK_POOL`, not a tag limit.
"""

# A dataset always maps to the same WAL shard, so one run per shard value means a dataset never has
# two flushes (or a flush and a compaction) running at once.
WAL_SHARD_TAG = "runstate/wal_shard"
# The shard plan's key: every run (and retry) of one plan carries it.
WAL_BATCH_TAG = "runstate/wal_batch"
DATASET_TAG = "runstate/dataset"
# One dataset-table merge run per merge shard at a time (each holds a Spark session).
MERGE_SHARD_TAG = "runstate/merge_shard"
MAINTENANCE_WORKER_TAG = "runstate/maintenance_worker"
# Every job that may start a Spark session carries it: a label for the UI's run filters. The cap itself
# is the pool below; an older dagster.yaml's `runstate/spark` tag limit still works beside it.
SPARK_TAG = "runstate/spark"
SPARK_JOB_TAGS = {SPARK_TAG: "session"}
# The Dagster pool of every op and asset that builds a Spark session (a JVM of about a core and a
# gigabyte): its limit (RUNSTATE_SPARK_SESSIONS, set in the instance by `runstate db upgrade`, `services up`
# and `spark_pool_sensor`) is how many sessions are alive at once across all runs.
SPARK_POOL = "runstate_spark"
DOMAIN_TAG = "runstate/domain"
# One in-progress run per table written (run_events, run_snapshots).
TABLE_TAG = "runstate/table"
SCHEDULED_DAY_TAG = "runstate/scheduled_day"
# The scheduled sweeps and checks that keep the deployment itself. run_recorder records their runs like
# any other, but no one waits for their history: run_history_sensor leaves their events for the next
# export (within half the lag bound), so an idle deployment does not start a Spark export per sweep.
HOUSEKEEPING_TAG = "runstate/housekeeping"
HOUSEKEEPING_TAGS = {HOUSEKEEPING_TAG: "true"}
# Work whose runs recur on their own, whatever the data does: an always-on shard's flush run hands the
# shard to a successor every run budget, idle or not. Its history waits as housekeeping's does; without
# the tag an idle deployment started a Spark export after every hand-over (one every two minutes or so).
HISTORY_CAN_WAIT_TAG = "runstate/history_can_wait"
HISTORY_CAN_WAIT_TAGS = {HISTORY_CAN_WAIT_TAG: "true"}

# Dagster's own tag: the run queue starts runs of a higher priority first (default 0).
PRIORITY_TAG = "dagster/priority"
# Dagster's own tag: run monitoring fails a run still STARTED after this many seconds.
MAX_RUNTIME_TAG = "dagster/max_runtime"
# Dagster's own tag: how often run retries (dagster.yaml's `run_retries`) re-execute a failed run. The
# jobs that a sensor requests (flushes, merges, maintenance workers) are re-planned by that sensor once
# their run is dead, with the work as it is then; a retry beside that request ran the work twice after
# every restart. So they opt out, and the sensor is their one retry, in any instance.
MAX_RETRIES_TAG = "dagster/max_retries"
REPLANNED_BY_SENSOR_TAGS = {MAX_RETRIES_TAG: "0"}
