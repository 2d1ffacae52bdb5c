"""The run history in the lake, in Dagster: the `run_history` asset (lake.<ns>.run_events and .runs),
the sensor that keeps it fresh, and the lag check.

- `run_history` runs the core's export (`export_history`, the command `runstate events export` runs
  too) on the shared Spark session and logs each commit as it lands. Its job carries the Spark tag (the
  `runstate/table: run_history` (one export in progress at a time); its step takes a slot of the Spark
  pool (`runstate_spark`) and ends its JVM before it gives the slot back, like every Spark step.
- `run_history_sensor`, every RUNSTATE_HISTORY_EXPORT_INTERVAL_S: a pure decision, without a JVM. It
  reads the table's position through pyiceberg and the feed after it, and requests one export run when
  the feed has more, unless an export run is alive: at most one at a time, however many runs and events
  there are. A run found dead (killed) no longer holds it. The events of the store's bookkeeping runs
  (exports and projections: the run recorder appends them) and of the housekeeping jobs (sweeps and
  checks, tagged `runstate/housekeeping`) wait for other events or half the lag bound, so an idle
  deployment exports at most once in that time.
- `run_history_lag` fails when the table is more than RUNSTATE_HISTORY_MAX_LAG_EVENTS events or
  RUNSTATE_HISTORY_MAX_LAG_MINUTES behind the feed (evaluated every 10 minutes, no JVM); the asset's
  FreshnessPolicy, from its materializations, warns when no export ran for that long and fails at twice.
"""

from collections.abc import Callable
from datetime import timedelta

import dagster as dg
from pydantic import Field

from runstate.config import Settings, settings
from runstate.defs.eventstore.assets import BOOKKEEPING_JOBS, EXPORT_JOB, run_events
from runstate.defs.eventstore.resources import EventStoreResource
from runstate.defs.runs.interrupts import ends_run_when_interrupted
from runstate.defs.runs.liveness import RunLiveness, check_runs
from runstate.defs.spark import SparkResource, ends_spark_session
from runstate.defs.tags import (
    DOMAIN_TAG,
    HISTORY_CAN_WAIT_TAG,
    HOUSEKEEPING_TAG,
    HOUSEKEEPING_TAGS,
    SPARK_JOB_TAGS,
    SPARK_POOL,
    TABLE_TAG,
)
from runstate.eventstore import StoredEvent
from runstate.eventstore.lake import (
    ExportTally,
    FeedRefused,
    HistoryCatalog,
    HistoryConfig,
    HistoryError,
    export_due,
    export_history,
    history_lag,
)
from runstate.spark import SparkSettings
from runstate.spark_interrupts import spark_jobs_cancelled_on_interrupt

RUN_HISTORY = "run_history"
LAG_CHECK = "run_history_lag"
HISTORY_TAGS = {**SPARK_JOB_TAGS, TABLE_TAG: RUN_HISTORY, DOMAIN_TAG: "eventstore"}
# A conflict (another export committed first) or a lost connection: the next attempt starts from the
# table's position, so a retry is always safe.
EXPORT_RETRY_POLICY = dg.RetryPolicy(max_retries=2, delay=5, backoff=dg.Backoff.EXPONENTIAL)


class ExportConfig(dg.Config):
    once: bool = Field(
        default=False, description="Commit one batch only (default: export until the feed's end)."
    )


def build_history_defs(s: Settings | None = None) -> dg.Definitions:
    """The run history's definitions; `event_store` and `spark` come from the eventstore and shared ones."""
    s = s or settings()
    history = HistoryConfig.from_settings(s)
    spark_settings = SparkSettings.from_settings(s)
    asset = _run_history_asset(history)
    job = dg.define_asset_job(
        EXPORT_JOB,
        selection=[asset],
        tags=HISTORY_TAGS,
        description="Export the run state store's feed into lake.<ns>.run_events and .runs, exactly once.",
    )
    check = _lag_check(history, spark_settings)
    check_job = dg.define_asset_job(
        f"{LAG_CHECK}_check",
        selection=dg.AssetSelection.checks(check),
        description="Evaluate run_history_lag: fail when the run history is too far behind the feed.",
        tags=HOUSEKEEPING_TAGS,
    )
    return dg.Definitions(
        assets=[asset],
        asset_checks=[check],
        jobs=[job, check_job],
        sensors=[_export_sensor(history, spark_settings)],
        schedules=[
            dg.ScheduleDefinition(
                name=f"{LAG_CHECK}_schedule",
                job=check_job,
                cron_schedule="6-59/10 * * * *",
                default_status=dg.DefaultScheduleStatus.RUNNING,
                description="Evaluate the run_history_lag check every 10 minutes.",
            )
        ],
    )


def _run_history_asset(history: HistoryConfig) -> dg.AssetsDefinition:
    @dg.asset(
        name=RUN_HISTORY,
        deps=[run_events],
        group_name="eventstore",
        pool=SPARK_POOL,
        retry_policy=EXPORT_RETRY_POLICY,
        # Materialized by every export, so it warns when none ran for the lag bound (a deployment always
        # has events: its own runs are recorded) and fails at twice that; run_history_lag is the exact alert.
        freshness_policy=dg.FreshnessPolicy.time_window(
            fail_window=timedelta(minutes=2 * history.max_lag_minutes),
            warn_window=timedelta(minutes=history.max_lag_minutes),
        ),
        description=(
            f"Every event of the run state store, exactly once, in {history.events_table} (every column of "
            f"run_events plus its feed position, by day of emitted_at) and one row per run in "
            f"{history.runs_table}; query them with `runstate sql`."
        ),
    )
    @ends_run_when_interrupted
    @ends_spark_session
    def run_history(
        context: dg.AssetExecutionContext,
        config: ExportConfig,
        event_store: EventStoreResource,
        spark: SparkResource,
    ) -> dg.MaterializeResult:
        tally = ExportTally()
        session = spark.get_session()
        # A SIGTERM (the deployment stopping) cancels the Spark job in flight: the run ends at once.
        with spark_jobs_cancelled_on_interrupt(session) as interrupt:
            try:
                for step in export_history(session, event_store.get_store(), history, once=config.once):
                    context.log.info(step.describe())
                    tally.add(step)
            except FeedRefused as refused:
                raise dg.Failure(description=str(refused), allow_retries=False) from refused
            except HistoryError:
                interrupt.check()  # a commit cancelled by the signal is no export failure
                raise
        metadata: dict[str, object] = {
            "events_exported": tally.events,
            "commits": tally.commits,
            "runs_merged": tally.runs_merged,
            "events_table": history.events_table,
            "runs_table": history.runs_table,
        }
        if tally.position is not None:
            metadata.update(from_position=tally.from_position, position=tally.position)
        return dg.MaterializeResult(metadata=metadata)

    return run_history


def _lag_check(history: HistoryConfig, spark_settings: SparkSettings) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=RUN_HISTORY,
        name=LAG_CHECK,
        description=(
            f"Fails when the run history is more than {history.max_lag_events} events or "
            f"{history.max_lag_minutes} minutes behind the feed."
        ),
    )
    def run_history_lag(event_store: EventStoreResource) -> dg.AssetCheckResult:
        catalog = HistoryCatalog.from_spark_settings(spark_settings)
        try:
            lag = history_lag(event_store.get_store(), catalog, history)
        finally:
            catalog.close()
        return dg.AssetCheckResult(
            passed=lag.passed(),
            severity=dg.AssetCheckSeverity.ERROR,
            description=lag.describe(),
            metadata={
                "position": lag.position,
                "behind_events": lag.behind,
                "oldest_behind_age_s": round(lag.age_s(), 1),
                "max_lag_events": history.max_lag_events,
                "max_lag_minutes": history.max_lag_minutes,
            },
        )

    return run_history_lag


def live_export(instance: dg.DagsterInstance) -> RunLiveness | None:
    """The latest export run when it is alive (queued, launching, or beating); a dead one is reaped."""
    records = instance.get_run_records(filters=dg.RunsFilter(job_name=EXPORT_JOB), limit=1)
    if not records:
        return None
    verdict = check_runs(instance, records)[0]
    return verdict if verdict.alive else None


def can_wait(repository: dg.RepositoryDefinition | None) -> Callable[[StoredEvent], bool]:
    """Whether an event waits for the next export: it is of a run (the run recorder names each event's
    Dagster job) of the store's bookkeeping jobs or of a job of `repository` tagged HOUSEKEEPING_TAG or
    HISTORY_CAN_WAIT_TAG."""
    tagged = repository.get_all_jobs() if repository is not None else []
    waiting_tags = (HOUSEKEEPING_TAG, HISTORY_CAN_WAIT_TAG)
    jobs = BOOKKEEPING_JOBS | {
        job.name for job in tagged if any(job.tags.get(tag) == "true" for tag in waiting_tags)
    }

    def waits(event: StoredEvent) -> bool:
        ref = event.engine_run_ref
        return isinstance(ref, dict) and ref.get("job_name") in jobs

    return waits


def _export_sensor(history: HistoryConfig, spark_settings: SparkSettings) -> dg.SensorDefinition:
    @dg.sensor(
        name="run_history_sensor",
        job_name=EXPORT_JOB,
        minimum_interval_seconds=history.export_interval_s,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Every {history.export_interval_s} s: one export_run_history run when the feed has events "
        "the run history lacks, unless an export run is alive.",
    )
    def run_history_sensor(
        context: dg.SensorEvaluationContext, event_store: EventStoreResource
    ) -> dg.SensorResult | dg.SkipReason:
        holder = live_export(context.instance)
        if holder is not None:
            return dg.SkipReason(f"an export is in progress: {holder.describe()}")
        try:
            catalog = HistoryCatalog.from_spark_settings(spark_settings)
            try:
                deferrable = can_wait(context.repository_def)
                due = export_due(event_store.get_store(), catalog, history, deferrable=deferrable)
            finally:
                catalog.close()
        except (FeedRefused, HistoryError) as refused:
            return dg.SkipReason(str(refused))
        if due.position is None:
            return dg.SkipReason(due.reason)
        position = due.position
        tick = int(context.cursor) + 1 if (context.cursor or "").isdigit() else 1
        request = dg.RunRequest(job_name=EXPORT_JOB, run_key=f"{RUN_HISTORY}-p{position}-t{tick}")
        return dg.SensorResult(run_requests=[request], cursor=str(tick))

    return run_history_sensor
