"""`maintenance_queue_sensor`: keeps up to W `iceberg_maintenance` worker runs alive while jobs are queued.

A worker run claims its jobs itself, one after another on one Spark session, so the sensor claims
nothing: it reads the queue depth and the instance's live worker runs, and requests the difference.
A worker run in progress without a heartbeat is reported failed first (`runstate.defs.runs.liveness`),
which frees its Spark slot, and the leases of every claim held by a worker run that is not alive end
now, so the next worker takes those jobs over within a tick instead of when the lease (15 minutes) runs
out: after a restart of the deployment, its jobs resume in seconds. Run keys come from the cursor's
request counter, so a re-evaluated tick never doubles them.
"""

import json

import dagster as dg

from runstate.defs.maintenance.jobs import iceberg_maintenance
from runstate.defs.maintenance.resources import MaintenanceResource
from runstate.defs.runs.liveness import RunLiveness, check_runs
from runstate.defs.tags import MAINTENANCE_WORKER_TAG, REPLANNED_BY_SENSOR_TAGS

IN_PROGRESS = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


def live_workers(instance: dg.DagsterInstance) -> list[RunLiveness]:
    """The worker runs alive now; those found in progress without a heartbeat are reported failed."""
    records = instance.get_run_records(dg.RunsFilter(job_name=iceberg_maintenance.name, statuses=IN_PROGRESS))
    return [verdict for verdict in check_runs(instance, records) if verdict.alive]


@dg.sensor(
    job=iceberg_maintenance,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Keep up to W iceberg_maintenance worker runs alive while maintenance jobs are queued.",
)
def maintenance_queue_sensor(context: dg.SensorEvaluationContext, maintenance: MaintenanceResource):
    store = maintenance.get_store()
    # The holders before the runs: a worker run that claims after this read is in the runs read next.
    holders = store.queue.claim_holders(maintenance.worker_prefix)
    alive = live_workers(context.instance)  # a dead worker's Spark slot is freed even when idle
    released = store.queue.expire_leases_of(set(holders) - {maintenance.worker_id(w.run_id) for w in alive})
    if released:
        context.log.info(f"took back {len(released)} job(s) held by dead worker runs: {', '.join(released)}")
    ready, _ = store.queue.queue_depth()
    if not ready:
        return dg.SkipReason("no ready maintenance jobs")
    wanted = min(maintenance.max_worker_runs - len(alive), ready)
    if wanted <= 0:
        return dg.SkipReason(
            f"{len(alive)} worker run(s) alive, the limit is {maintenance.max_worker_runs}: "
            + "; ".join(worker.describe() for worker in alive)
        )
    requested = _requests_so_far(context.cursor)
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                run_key=f"maintenance-worker-{requested + i + 1}",
                # A dead worker's jobs go back to the queue and this sensor starts another worker: no retry.
                tags={MAINTENANCE_WORKER_TAG: "true", **REPLANNED_BY_SENSOR_TAGS},
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
