"""The maintenance Dagster shell without Spark: the worker-run sensor and its limit, submits, sweeps."""

from __future__ import annotations

from types import SimpleNamespace

import dagster as dg
import pytest

from runstate.defs.maintenance import build_defs
from runstate.defs.maintenance.jobs import (
    MaintenanceWorkerConfig,
    run_maintenance_worker,
    stop_requested,
    submit_maintenance,
)
from runstate.defs.maintenance.resources import MaintenanceResource
from runstate.defs.maintenance.schedules import lock_sweep, stale_claim_sweep
from runstate.defs.maintenance.sensors import maintenance_queue_sensor
from runstate.defs.runs.beats import beat
from runstate.defs.tags import MAINTENANCE_WORKER_TAG
from runstate.maintenance.identifiers import TableRef
from runstate.maintenance.models import CachedTable
from runstate_tests.support.runs import started_run


@pytest.fixture
def resource(pg_database, pg_schema):
    res = MaintenanceResource(dsn=pg_database, pg_schema=pg_schema, max_worker_runs=2, lease_seconds=120)
    res.get_store().cache.replace_table_cache([CachedTable("db", f"t{i}", True, {}) for i in range(3)])
    yield res
    res.get_store().close()


def evaluate(resource, instance=None):
    instance = instance or dg.DagsterInstance.ephemeral()
    with dg.build_sensor_context(resources={"maintenance": resource}, instance=instance) as context:
        return maintenance_queue_sensor(context)


def test_the_sensor_requests_up_to_w_worker_runs_and_claims_nothing(resource):
    store = resource.get_store()
    jobs = [store.submit("db", f"t{i}", ["rewrite_manifests"]) for i in range(3)]

    first = evaluate(resource)

    assert len(first.run_requests) == 2  # W = 2, three jobs ready
    assert [r.run_key for r in first.run_requests] == ["maintenance-worker-1", "maintenance-worker-2"]
    assert all(r.tags[MAINTENANCE_WORKER_TAG] == "true" for r in first.run_requests)
    assert all(
        store.queue.get_job(job_id).status == "pending" for job_id in jobs
    )  # workers claim, not the sensor


def test_the_sensor_counts_the_worker_runs_still_alive(resource):
    resource.get_store().submit("db", "t0", ["rewrite_manifests"])
    instance = dg.DagsterInstance.ephemeral()
    job = build_defs({"maintenance": resource, "spark": _no_spark()}).resolve_job_def("iceberg_maintenance")
    for _ in range(2):  # created, not started: what the run queue holds while the daemon waits
        instance.create_run_for_job(job, run_config={})

    result = evaluate(resource, instance)

    assert isinstance(result, dg.SkipReason) and "limit is 2" in result.skip_message


def test_the_sensor_skips_an_empty_queue(resource):
    assert isinstance(evaluate(resource), dg.SkipReason)


def test_a_worker_run_with_an_empty_queue_never_starts_spark(resource):
    defs = build_defs({"maintenance": resource, "spark": _no_spark()})

    result = defs.resolve_job_def("iceberg_maintenance").execute_in_process()

    assert result.success
    assert result.output_for_node("run_maintenance_worker")["jobs"] == 0


def test_a_worker_run_told_to_stop_claims_nothing(resource, bare_instance):
    store = resource.get_store()
    jobs = [store.submit("db", f"t{i}", ["rewrite_manifests"]) for i in range(2)]
    # Invoked on its own, the op finds no run of its id in the instance: a run that is gone counts as
    # told to stop, as one being terminated does.
    resources = {"maintenance": resource, "spark": _no_spark()}
    with dg.build_op_context(resources=resources, instance=bare_instance) as context:
        summary = run_maintenance_worker(context, MaintenanceWorkerConfig())

    assert summary["stopped"] is True and summary["jobs"] == 0
    assert [store.queue.get_job(job_id).status for job_id in jobs] == ["pending", "pending"]


@pytest.mark.parametrize(
    "status, stop",
    [
        (dg.DagsterRunStatus.STARTED, False),
        (dg.DagsterRunStatus.CANCELING, True),
        (dg.DagsterRunStatus.FAILURE, True),
    ],
)
def test_a_worker_run_is_told_to_stop_once_terminated_or_declared_dead(resource, bare_instance, status, stop):
    job = build_defs({"maintenance": resource, "spark": _no_spark()}).resolve_job_def("iceberg_maintenance")
    run = bare_instance.create_run_for_job(job, run_config={}, status=status)

    assert stop_requested(SimpleNamespace(instance=bare_instance, run_id=run.run_id)) is stop


def _no_spark():
    from runstate.defs.spark import SparkResource

    return SparkResource(master="invalid://never-started")  # a worker with nothing to do must not start Spark


def test_submit_maintenance_queues_a_job_and_returns_the_active_one_on_resubmit(resource):
    config = {
        "ops": {
            "submit_maintenance_request": {"config": {"table": "db.t1", "dry_run": True, "retain_last": 3}}
        }
    }

    first = submit_maintenance.execute_in_process(run_config=config, resources={"maintenance": resource})
    second = submit_maintenance.execute_in_process(run_config=config, resources={"maintenance": resource})

    job_id = first.output_for_node("submit_maintenance_request")
    assert second.output_for_node("submit_maintenance_request") == job_id
    job = resource.get_store().queue.get_job(job_id)
    assert job.dry_run and job.options == {"retain_last": 3} and job.status == "pending"


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        ({"table": "db.t1; DROP TABLE jobs"}, "not a valid identifier"),
        ({"table": "db.t1", "actions": ["vacuum"]}, "unknown maintenance action"),
        ({"table": "db.t1", "rewrite_strategy": "sort", "sort_order": "id'--"}, "sort_order term"),
        ({"table": "db.not_cached"}, "not in the catalog cache"),
    ],
)
def test_submit_maintenance_refuses_bad_input_and_writes_nothing(resource, overrides, fragment):
    config = {"ops": {"submit_maintenance_request": {"config": overrides}}}

    result = submit_maintenance.execute_in_process(
        run_config=config, resources={"maintenance": resource}, raise_on_error=False
    )

    assert not result.success
    failure = [e for e in result.all_events if e.is_step_failure][0]
    assert fragment in str(failure.event_specific_data.error)
    assert resource.get_store().queue.list_jobs() == []


def test_sweep_jobs_run_against_the_store(resource):
    store = resource.get_store()
    assert store.acquire_table_lock("db.t0", "gone-worker", ttl_seconds=0.001)
    defs = build_defs({"maintenance": resource, "spark": _no_spark()})

    swept = defs.resolve_job_def("maintenance_lock_sweep").execute_in_process()
    claims = defs.resolve_job_def("maintenance_claim_sweep").execute_in_process()
    pruned = defs.resolve_job_def("maintenance_health_retention").execute_in_process()

    assert (
        swept.output_for_node("sweep_expired_locks") == 1
        and store.locks.table_lock(TableRef("db", "t0")) is None
    )
    assert claims.success and pruned.success


def sweep_tick(schedule: dg.ScheduleDefinition, resource) -> list:
    """What the schedule's tick asks for: its run requests, or [] when it skipped."""
    with dg.build_schedule_context(resources={"maintenance": resource}) as context:
        data = schedule.evaluate_tick(context)
    return list(data.run_requests or [])


def test_the_sweep_schedules_start_a_run_only_when_there_is_something_to_sweep(resource):
    store = resource.get_store()
    live = store.submit("db", "t0", ["rewrite_manifests"])
    expiring = store.submit("db", "t1", ["rewrite_manifests"])
    assert store.claim("live-worker", 120).job_id == live
    assert store.acquire_table_lock("db.t0", "live-worker", ttl_seconds=120)

    idle = (sweep_tick(stale_claim_sweep, resource), sweep_tick(lock_sweep, resource))
    assert store.claim("gone-worker", 0.001).job_id == expiring
    assert store.acquire_table_lock("db.t1", "gone-worker", ttl_seconds=0.001)
    due = (sweep_tick(stale_claim_sweep, resource), sweep_tick(lock_sweep, resource))
    store.queue.sweep_stale_claims()
    store.locks.sweep_expired_locks()
    swept = (sweep_tick(stale_claim_sweep, resource), sweep_tick(lock_sweep, resource))

    assert idle == ([], []) and swept == ([], [])
    assert [len(requests) for requests in due] == [1, 1]
    assert store.queue.get_job(expiring).status == "pending" and store.queue.get_job(live).status == "running"


def test_the_sensor_takes_back_at_once_the_jobs_of_a_dead_worker_run(resource, bare_instance):
    store = resource.get_store()
    jobs = [store.submit("db", f"t{i}", ["rewrite_manifests"]) for i in range(3)]
    job = build_defs({"maintenance": resource, "spark": _no_spark()}).resolve_job_def("iceberg_maintenance")
    dead, alive = (started_run(bare_instance, job) for _ in range(2))
    beat(bare_instance, dead.run_id, age_s=600)  # killed ten minutes ago with the deployment
    beat(bare_instance, alive.run_id)
    held = {
        resource.worker_id(dead.run_id): store.claim(resource.worker_id(dead.run_id), 120),
        resource.worker_id(alive.run_id): store.claim(resource.worker_id(alive.run_id), 120),
        "cli-worker": store.claim("cli-worker", 120),  # not a run of this deployment: left alone
    }
    assert store.queue.queue_depth() == (0, 3)

    evaluate(resource, bare_instance)

    assert bare_instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.FAILURE
    assert store.queue.queue_depth() == (1, 3)
    taken_over = store.claim("successor", 120)
    assert taken_over.job_id == held[resource.worker_id(dead.run_id)].job_id
    assert taken_over.attempt_count == 2
    assert not store.heartbeat(held[resource.worker_id(dead.run_id)])  # the dead worker is fenced out
    assert store.heartbeat(held[resource.worker_id(alive.run_id)]) and store.heartbeat(held["cli-worker"])
    assert sorted(c.job_id for c in held.values()) == sorted(jobs)
