"""Maintenance jobs: `iceberg_maintenance` (one claimed job), `submit_maintenance` (manual requests),
the orchestrator run, and the sweeps. Ops take Pydantic config and call the core."""


from typing import List, Optional

import dagster as dg
from pydantic import Field

from runstate.defs.maintenance.assets import table_inventory
from runstate.defs.maintenance.resources import MaintenanceResource
from runstate.defs.spark import SparkResource
from runstate.maintenance.actions import ActionSettings, TableLocked, resume_claim, run_job
from runstate.maintenance.health import HealthAnalyzer
from runstate.maintenance.identifiers import parse_table_ref
from runstate.maintenance.orchestrator import Orchestrator

# A transient fault (a database blip, the table lock still held) is worth a few spaced-out retries;
# the claim's lease outlives them and the run carries the same fence.
TRANSIENT_RETRY = dg.RetryPolicy(max_retries=3, delay=20, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS)
DEFAULT_ACTIONS = ["rewrite_data_files", "rewrite_position_delete_files", "rewrite_manifests", "expire_snapshots"]


class MaintenanceClaimConfig(dg.Config):
    """Set by maintenance_queue_sensor: the claimed job and the fence of this attempt."""

    job_id: str = Field(description="jobs.job_id of the claimed job.")
    attempt_id: str = Field(description="The claim's fence; the run acts only while it still holds.")


@dg.op(retry_policy=TRANSIENT_RETRY, description="Hold the table lock, heartbeat, run the actions, complete under the fence.")
def run_maintenance_job(
    context: dg.OpExecutionContext, config: MaintenanceClaimConfig, spark: SparkResource,
    maintenance: MaintenanceResource,
) -> dict:
    store = maintenance.get_store()
    claim = resume_claim(store, config.job_id, config.attempt_id, maintenance.lease_seconds)
    if claim is None:
        raise dg.Failure(
            f"maintenance job {config.job_id}: attempt {config.attempt_id} no longer holds the job "
            "(fenced out, finished or unknown); nothing was run",
            allow_retries=False,
        )
    try:
        outcome = run_job(spark.get_session(), store, claim, settings=maintenance.action_settings(),
                          lock_ttl_seconds=maintenance.lock_ttl_seconds)
    except TableLocked as exc:
        context.log.warning(str(exc))
        raise
    metadata = {
        "job_id": outcome.job_id, "table": claim.table_key, "status": outcome.status, "dry_run": claim.dry_run,
        **{f"{r.action}": r.message or (r.error or "") for r in outcome.results},
    }
    context.add_output_metadata(metadata)
    if outcome.status in ("failed", "fenced_out"):
        raise dg.Failure(f"maintenance job {outcome.job_id} on {claim.table_key}: {outcome.status}: {outcome.error or ''}",
                         metadata=metadata, allow_retries=False)
    return {"job_id": outcome.job_id, "status": outcome.status}


@dg.job(description="Run one claimed maintenance job (launched by maintenance_queue_sensor, run_key = attempt_id).")
def iceberg_maintenance() -> None:
    run_maintenance_job()


class SubmitMaintenanceConfig(dg.Config):
    """A manual maintenance request from the launchpad."""

    table: str = Field(description="The table as `database.table`.")
    actions: List[str] = Field(default=DEFAULT_ACTIONS, description="Any of the ACTIONS; run in their fixed order.")
    dry_run: bool = Field(default=False, description="Plan only: report what would be done, write nothing.")
    rewrite_strategy: Optional[str] = Field(default=None, description="binpack (default) or sort.")
    sort_order: Optional[str] = Field(default=None, description="For sort: e.g. `id DESC NULLS LAST, ts`.")
    target_file_size_bytes: Optional[int] = Field(default=None, description="rewrite_data_files target size.")
    expire_older_than_hours: Optional[float] = Field(default=None, description="expire_snapshots older_than.")
    retain_last: Optional[int] = Field(default=None, description="expire_snapshots retain_last.")
    orphan_older_than_hours: Optional[float] = Field(default=None, description="remove_orphan_files older_than.")

    def options(self) -> dict:
        names = ("rewrite_strategy", "sort_order", "target_file_size_bytes", "expire_older_than_hours",
                 "retain_last", "orphan_older_than_hours")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


@dg.op(description="Validate and queue a maintenance job; an active job of the table is returned instead.")
def submit_maintenance_request(
    context: dg.OpExecutionContext, config: SubmitMaintenanceConfig, maintenance: MaintenanceResource
) -> str:
    ref = parse_table_ref(config.table)
    options = config.options()
    ActionSettings.from_options(options, maintenance.action_settings())  # bad options: nothing queued
    job_id = maintenance.get_store().submit(ref.database, ref.table, config.actions, dry_run=config.dry_run,
                                            options=options)
    context.add_output_metadata({"job_id": job_id, "table": ref.key, "dry_run": config.dry_run})
    return job_id


@dg.job(description="Queue a maintenance job by hand (table, actions, dry_run, options).")
def submit_maintenance() -> None:
    submit_maintenance_request()


class OrchestratorConfig(dg.Config):
    dry_run: Optional[bool] = Field(default=None, description="Advisory only; default from the resource.")


@dg.op(description="Assess every cached table and submit jobs for the unhealthy opted-in ones.")
def run_orchestrator(
    context: dg.OpExecutionContext, config: OrchestratorConfig, spark: SparkResource, maintenance: MaintenanceResource
) -> dict:
    analyzer: list[HealthAnalyzer] = []

    def analyze(ref):  # Spark starts only when some table gets past the cheap skips
        if not analyzer:
            analyzer.append(HealthAnalyzer(spark.get_session(), maintenance.thresholds()))
        return analyzer[0].analyze(ref)

    report = Orchestrator(maintenance.get_store(), analyze, maintenance.orchestrator_settings(config.dry_run)).run()
    for decision in report.decisions:
        context.log.info(f"{decision.table_key}: {decision.decision} {decision.reason} "
                         f"{' '.join(decision.recommended_actions)} {decision.job_id or ''}".rstrip())
    summary = report.summary()
    context.add_output_metadata({**summary, "orchestrator_run_id": report.run_id})
    return summary


@dg.job(description="The orchestrator: one audited pass over the table cache (orchestrator_runs).")
def maintenance_orchestrator_job() -> None:
    run_orchestrator()


@dg.op(description="Expired leases back to pending; out of attempts -> failed.")
def sweep_stale_claims(context: dg.OpExecutionContext, maintenance: MaintenanceResource) -> int:
    changed = maintenance.get_store().sweep_stale_claims()
    context.add_output_metadata({"claims_swept": changed})
    return changed


@dg.op(description="Delete expired table locks.")
def sweep_expired_locks(context: dg.OpExecutionContext, maintenance: MaintenanceResource) -> int:
    removed = maintenance.get_store().sweep_expired_locks()
    context.add_output_metadata({"locks_removed": removed})
    return removed


@dg.op(description="Drop health_snapshots older than the retention (each table keeps its newest row).")
def prune_health(context: dg.OpExecutionContext, maintenance: MaintenanceResource) -> int:
    removed = maintenance.get_store().prune_health(maintenance.health_keep_days)
    context.add_output_metadata({"health_rows_removed": removed})
    return removed


@dg.job(description="Return expired maintenance claims to the queue.")
def maintenance_claim_sweep() -> None:
    sweep_stale_claims()


@dg.job(description="Clear expired table locks.")
def maintenance_lock_sweep() -> None:
    sweep_expired_locks()


@dg.job(description="Apply the health_snapshots retention.")
def maintenance_health_retention() -> None:
    prune_health()


table_inventory_job = dg.define_asset_job("table_inventory_job", selection=[table_inventory],
                                          description="Copy the catalog into the table cache.")
