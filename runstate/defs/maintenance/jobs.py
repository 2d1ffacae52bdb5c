"""Maintenance jobs: `iceberg_maintenance` (a worker run that drains the queue on one Spark session),
`submit_maintenance` (manual requests), the orchestrator run, and the sweeps. Ops take Pydantic config
and call the core."""

from contextlib import closing
from typing import Any

import dagster as dg
from pydantic import Field

from runstate.defs.maintenance.assets import table_inventory
from runstate.defs.maintenance.resources import MaintenanceResource
from runstate.defs.runs.heartbeat import ensure_alive
from runstate.defs.runs.interrupts import ends_run_when_interrupted
from runstate.defs.runs.liveness import DEAD_STATUSES
from runstate.defs.spark import SparkResource, ends_spark_session
from runstate.defs.tags import HOUSEKEEPING_TAGS, SPARK_JOB_TAGS, SPARK_POOL
from runstate.maintenance.health import HealthAnalyzer
from runstate.maintenance.identifiers import DEFAULT_ACTIONS, parse_table_ref
from runstate.maintenance.options import ActionSettings
from runstate.maintenance.orchestrator import Orchestrator
from runstate.maintenance.plan import ActionPlan
from runstate.maintenance.runner import JobOutcome, QueueWorker, WorkerReport
from runstate.spark_interrupts import spark_jobs_cancelled_on_interrupt

# A transient fault (a database blip) is worth a few spaced-out retries; a retried worker simply
# claims whatever is still queued, and every job keeps its own fence.
TRANSIENT_RETRY = dg.RetryPolicy(
    max_retries=2, delay=20, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
)
STOPPED_STATUSES = DEAD_STATUSES | {dg.DagsterRunStatus.CANCELING}
FIGURES = ("data_files", "data_bytes", "delete_files", "manifests")


class MaintenanceWorkerConfig(dg.Config):
    """Limits of one worker run; defaults come from the resource."""

    budget_seconds: float | None = Field(default=None, description="Claim no new job after this long.")
    max_jobs: int | None = Field(default=None, description="Stop after this many jobs (None: until empty).")


def job_metadata(outcome: JobOutcome) -> dict[str, Any]:
    """One job's run metadata: its status and, per action, the table's figures before and after."""
    actions = [
        {
            "action": r.action,
            "success": r.success,
            "attempts": r.attempts,
            "message": r.message or r.error or "",
            "before": dict(r.before),
            "after": dict(r.after),
        }
        for r in outcome.results
    ]
    return {
        "table": outcome.ref.key,
        "status": outcome.status,
        "error": outcome.error or "",
        "actions": actions,
    }


def _figure_totals(jobs: list[dict[str, Any]]) -> dict[str, float]:
    """Sum of each figure before the first and after the last action of every job that measured them."""
    totals: dict[str, float] = {}
    for job in jobs:
        measured = [a for a in job["actions"] if a["before"] and a["after"]]
        if not measured:
            continue
        for name in FIGURES:
            totals[f"{name}_before"] = totals.get(f"{name}_before", 0) + measured[0]["before"].get(name, 0)
            totals[f"{name}_after"] = totals.get(f"{name}_after", 0) + measured[-1]["after"].get(name, 0)
    return totals


def stop_requested(context: dg.OpExecutionContext) -> bool:
    """Claim no more once the run is being terminated (the UI's Terminate) or was declared dead (no
    heartbeat: the sensor has released its claims, so new ones would stay held by a dead worker)."""
    run = context.instance.get_run_by_id(context.run_id)
    return run is None or run.status in STOPPED_STATUSES


def worker_summary(report: WorkerReport, jobs: dict[str, dict[str, Any]], stopped: bool) -> dict:
    """The worker run's output: how many jobs ended how, and whether a stop request ended it."""
    summary = {status: report.count(status) for status in ("completed", "failed", "cancelled", "fenced_out")}
    summary.update(jobs=len(report.outcomes), table_locked=len(report.locked), stopped=stopped)
    return summary


@dg.op(
    pool=SPARK_POOL,
    retry_policy=TRANSIENT_RETRY,
    description="Claim jobs one after another on one Spark session until the queue is empty or time is up.",
)
@ends_run_when_interrupted
@ends_spark_session
def run_maintenance_worker(
    context: dg.OpExecutionContext,
    config: MaintenanceWorkerConfig,
    spark: SparkResource,
    maintenance: MaintenanceResource,
) -> dict:
    worker = QueueWorker(
        maintenance.get_store(),
        maintenance.worker_id(context.run_id),
        lease_seconds=maintenance.lease_seconds,
        settings=maintenance.action_settings(),
        lock_ttl_seconds=maintenance.lock_ttl_seconds,
    )
    budget = config.budget_seconds or maintenance.worker_budget_seconds
    jobs: dict[str, dict[str, Any]] = {}
    # The session starts with the first job claimed: an empty queue starts no JVM. A SIGTERM cancels the
    # Spark job in flight, so the worker fails its run at once instead of waiting for the action to end.
    runs = worker.run(spark.get_session, budget_seconds=budget, max_jobs=config.max_jobs)
    with closing(runs) as outcomes, spark_jobs_cancelled_on_interrupt() as interrupt:
        # Asked before each claim: the one place this run decides to claim no more. A run declared dead
        # stops its process here (ensure_alive) before it claims or reports anything.
        while True:
            ensure_alive(context)
            if stopped := stop_requested(context):
                break
            outcome = next(outcomes, None)
            interrupt.check()  # an action cancelled by the signal is no job's failure
            if outcome is None:
                break
            ensure_alive(context)
            jobs[outcome.job_id] = job_metadata(outcome)
            context.log.info(
                f"job {outcome.job_id} on {outcome.ref.key}: {outcome.status} {outcome.error or ''}"
            )
    summary = worker_summary(worker.report, jobs, stopped)
    metadata: dict[str, Any] = {
        **summary,
        "worker_seconds": round(worker.report.elapsed_seconds, 3),
        **_figure_totals(list(jobs.values())),
    }
    metadata.update({f"job {job_id}": dg.MetadataValue.json(value) for job_id, value in jobs.items()})
    context.add_output_metadata(metadata)
    if summary["failed"]:
        failed = [f"{j['table']}: {j['error']}" for j in jobs.values() if j["status"] == "failed"]
        raise dg.Failure(
            f"{summary['failed']} maintenance job(s) failed: {'; '.join(failed)}",
            metadata=metadata,
            allow_retries=False,
        )
    return summary


@dg.job(
    description="A maintenance worker: drains the queue on one Spark session (maintenance_queue_sensor).",
    tags=SPARK_JOB_TAGS,
)
def iceberg_maintenance() -> None:
    run_maintenance_worker()


class SubmitMaintenanceConfig(dg.Config):
    """A manual maintenance request from the launchpad."""

    table: str = Field(description="The table as `database.table`.")
    actions: list[str] = Field(
        default=list(DEFAULT_ACTIONS), description="Any of the ACTIONS; run in their fixed order."
    )
    dry_run: bool = Field(default=False, description="Plan only: report what would be done, write nothing.")
    rewrite_strategy: str | None = Field(default=None, description="binpack (default) or sort.")
    sort_order: str | None = Field(default=None, description="For sort: e.g. `id DESC NULLS LAST, ts`.")
    target_file_size_bytes: int | None = Field(default=None, description="rewrite_data_files target size.")
    expire_older_than_hours: float | None = Field(default=None, description="expire_snapshots older_than.")
    retain_last: int | None = Field(default=None, description="expire_snapshots retain_last.")
    orphan_older_than_hours: float | None = Field(default=None, description="remove_orphan_files older_than.")
    delete_file_threshold: int | None = Field(
        default=None, description="rewrite_data_files: rewrite data files with this many delete files."
    )
    canary_planning: bool | None = Field(
        default=None, description="Time a full scan's planning around each action."
    )

    def options(self) -> dict:
        return {
            name: getattr(self, name) for name in ActionSettings.names() if getattr(self, name) is not None
        }


@dg.op(description="Validate and queue a maintenance job; an active job of the table is returned instead.")
def submit_maintenance_request(
    context: dg.OpExecutionContext, config: SubmitMaintenanceConfig, maintenance: MaintenanceResource
) -> str:
    ref = parse_table_ref(config.table)
    plan = ActionPlan.parse(config.actions, dry_run=config.dry_run, options=config.options())
    job_id = maintenance.get_store().queue.submit(ref, plan)
    context.add_output_metadata({"job_id": job_id, "table": ref.key, "dry_run": config.dry_run})
    return job_id


@dg.job(description="Queue a maintenance job by hand (table, actions, dry_run, options).")
def submit_maintenance() -> None:
    submit_maintenance_request()


class OrchestratorConfig(dg.Config):
    dry_run: bool | None = Field(default=None, description="Advisory only; default from the resource.")


@dg.op(
    pool=SPARK_POOL, description="Assess every cached table and submit jobs for the unhealthy opted-in ones."
)
@ends_spark_session
def run_orchestrator(
    context: dg.OpExecutionContext,
    config: OrchestratorConfig,
    spark: SparkResource,
    maintenance: MaintenanceResource,
) -> dict:
    # Spark starts only when some table gets past the cheap skips.
    analyzer = HealthAnalyzer(spark.get_session, maintenance.thresholds())
    report = Orchestrator(
        maintenance.get_store(), analyzer.analyze, maintenance.orchestrator_settings(config.dry_run)
    ).run()
    for decision in report.decisions:
        context.log.info(
            f"{decision.table_key}: {decision.decision} {decision.reason} "
            f"{' '.join(decision.recommended_actions)} {decision.job_id or ''}".rstrip()
        )
    summary = report.summary()
    context.add_output_metadata({**summary, "orchestrator_run_id": report.run_id})
    return summary


@dg.job(
    description="The orchestrator: one audited pass over the table cache (orchestrator_runs).",
    tags=SPARK_JOB_TAGS,
)
def maintenance_orchestrator_job() -> None:
    run_orchestrator()


@dg.op(description="Expired leases back to pending; out of attempts -> failed.")
def sweep_stale_claims(context: dg.OpExecutionContext, maintenance: MaintenanceResource) -> int:
    changed = maintenance.get_store().queue.sweep_stale_claims()
    context.add_output_metadata({"claims_swept": changed})
    return changed


@dg.op(description="Delete expired table locks.")
def sweep_expired_locks(context: dg.OpExecutionContext, maintenance: MaintenanceResource) -> int:
    removed = maintenance.get_store().locks.sweep_expired_locks()
    context.add_output_metadata({"locks_removed": removed})
    return removed


@dg.op(description="Drop health_snapshots older than the retention (each table keeps its newest row).")
def prune_health(context: dg.OpExecutionContext, maintenance: MaintenanceResource) -> int:
    removed = maintenance.get_store().history.prune_health(maintenance.health_keep_days)
    context.add_output_metadata({"health_rows_removed": removed})
    return removed


@dg.job(description="Return expired maintenance claims to the queue.", tags=HOUSEKEEPING_TAGS)
def maintenance_claim_sweep() -> None:
    sweep_stale_claims()


@dg.job(description="Clear expired table locks.", tags=HOUSEKEEPING_TAGS)
def maintenance_lock_sweep() -> None:
    sweep_expired_locks()


@dg.job(description="Apply the health_snapshots retention.", tags=HOUSEKEEPING_TAGS)
def maintenance_health_retention() -> None:
    prune_health()


table_inventory_job = dg.define_asset_job(
    "table_inventory_job",
    selection=[table_inventory],
    description="Copy the catalog into the table cache.",
    tags=SPARK_JOB_TAGS,
)
