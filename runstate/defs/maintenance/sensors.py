"""`maintenance_queue_sensor`: claims ready jobs up to the concurrency limit and launches one
`iceberg_maintenance` run per claim, with run_key = attempt_id (a re-claim is a new attempt, so a new run)."""


import json

import dagster as dg

from runstate.defs.maintenance.jobs import iceberg_maintenance
from runstate.defs.maintenance.resources import MaintenanceResource
from runstate.maintenance.actions import claim_ready

TABLE_TAG = "runstate/table"
JOB_TAG = "runstate/maintenance_job"


@dg.sensor(job=iceberg_maintenance, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Claim queued maintenance jobs (fenced, leased) and launch iceberg_maintenance runs.")
def maintenance_queue_sensor(context: dg.SensorEvaluationContext, maintenance: MaintenanceResource):
    # The only side effect is the claim; an unlaunched claim's lease expires and the job is claimed again.
    claims = claim_ready(maintenance.get_store(), maintenance.worker_name, maintenance.lease_seconds,
                         maintenance.concurrency_limit)
    if not claims:
        return dg.SkipReason("no ready maintenance jobs, or the concurrency limit is reached")
    cursor = {"claims": _claims_so_far(context.cursor) + len(claims), "last_attempt_id": claims[-1].attempt_id}
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                run_key=claim.attempt_id,
                run_config={"ops": {"run_maintenance_job": {"config": {"job_id": claim.job_id,
                                                                       "attempt_id": claim.attempt_id}}}},
                tags={TABLE_TAG: claim.table_key, JOB_TAG: claim.job_id},
            )
            for claim in claims
        ],
        cursor=json.dumps(cursor, sort_keys=True),
    )


def _claims_so_far(raw: str | None) -> int:
    """The cursor only counts claims (the queue itself is the source of truth), so a bad one restarts at 0."""
    try:
        return int(json.loads(raw).get("claims", 0)) if raw else 0
    except (ValueError, TypeError, AttributeError):
        return 0
