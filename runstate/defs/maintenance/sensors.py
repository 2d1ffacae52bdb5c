"""`maintenance_queue_sensor`: keeps up to W `iceberg_maintenance` worker runs alive while jobs are queued.

A worker run claims its jobs itself, one after another on one Spark session, so the sensor claims
nothing: it reads the queue depth and the instance's in-progress worker runs, and requests the
difference. Run keys come from the cursor's request counter, so a re-evaluated tick never doubles them.
"""

import json

import dagster as dg

from runstate.defs.maintenance.jobs import iceberg_maintenance
from runstate.defs.maintenance.resources import MaintenanceResource
from runstate.defs.tags import MAINTENANCE_WORKER_TAG

IN_PROGRESS = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


@dg.sensor(
    job=iceberg_maintenance,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Keep up to W iceberg_maintenance worker runs alive while maintenance jobs are queued.",
)
def maintenance_queue_sensor(context: dg.SensorEvaluationContext, maintenance: MaintenanceResource):
    ready, _ = maintenance.get_store().queue_depth()
    if not ready:
        return dg.SkipReason("no ready maintenance jobs")
    alive = context.instance.get_runs_count(
        dg.RunsFilter(job_name=iceberg_maintenance.name, statuses=IN_PROGRESS)
    )
    wanted = min(maintenance.max_worker_runs - alive, ready)
    if wanted <= 0:
        return dg.SkipReason(f"{alive} worker run(s) alive, the limit is {maintenance.max_worker_runs}")
    requested = _requests_so_far(context.cursor)
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                run_key=f"maintenance-worker-{requested + i + 1}", tags={MAINTENANCE_WORKER_TAG: "true"}
            )
            for i in range(wanted)
        ],
        cursor=json.dumps({"requests": requested + wanted}),
    )


def _requests_so_far(raw: str | None) -> int:
    """The cursor only numbers the requests (the queue is the source of truth); a bad one restarts at 0."""
    try:
        value = json.loads(raw).get("requests", 0) if raw else 0
        return value if isinstance(value, int) and value >= 0 else 0
    except (ValueError, TypeError, AttributeError):
        return 0
