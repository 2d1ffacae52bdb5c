"""The maintenance Dagster shell without Spark: queue sensor claims and limits, submit_maintenance, sweeps."""

from __future__ import annotations

import dagster as dg
import pytest

from runstate.defs.maintenance import build_defs
from runstate.defs.maintenance.jobs import submit_maintenance
from runstate.defs.maintenance.resources import MaintenanceResource
from runstate.defs.maintenance.sensors import maintenance_queue_sensor
from runstate.maintenance.store import CachedTable


@pytest.fixture
def resource(pg_database, pg_schema):
    res = MaintenanceResource(dsn=pg_database, pg_schema=pg_schema, concurrency_limit=2, lease_seconds=120)
    res.get_store().replace_table_cache([CachedTable("db", f"t{i}", True, {}) for i in range(3)])
    yield res
    res.get_store().close()


def evaluate(resource):
    with dg.build_sensor_context(resources={"maintenance": resource}) as context:
        return maintenance_queue_sensor(context)


def test_the_sensor_claims_up_to_the_concurrency_limit_with_attempt_run_keys(resource):
    store = resource.get_store()
    jobs = [store.submit("db", f"t{i}", ["rewrite_manifests"]) for i in range(3)]

    first = evaluate(resource)

    assert len(first.run_requests) == 2
    for request in first.run_requests:
        config = request.run_config["ops"]["run_maintenance_job"]["config"]
        job = store.get_job(config["job_id"])
        assert job.status == "running" and request.run_key == config["attempt_id"] == job.attempt_id
        assert request.tags["runstate/table"] == job.table_key
    assert isinstance(evaluate(resource), dg.SkipReason)  # both slots taken
    assert store.complete(_claim_of(store, first.run_requests[0]), "completed")

    third = evaluate(resource)

    assert len(third.run_requests) == 1
    claimed = {r.run_config["ops"]["run_maintenance_job"]["config"]["job_id"]
               for r in [*first.run_requests, *third.run_requests]}
    assert claimed == set(jobs)


def _claim_of(store, request):
    from runstate.maintenance.actions import resume_claim

    config = request.run_config["ops"]["run_maintenance_job"]["config"]
    return resume_claim(store, config["job_id"], config["attempt_id"], 120)


def test_a_fenced_out_run_fails_without_running_anything(resource, pg_database):
    store = resource.get_store()
    job_id = store.submit("db", "t0", ["rewrite_manifests"])
    stale = store.claim("w", lease_seconds=0.001)
    store.claim("w2", lease_seconds=120)  # the job moved on to a new attempt
    defs = build_defs({"maintenance": resource, "spark": _no_spark()})

    result = defs.resolve_job_def("iceberg_maintenance").execute_in_process(
        run_config={"ops": {"run_maintenance_job": {"config": {"job_id": job_id, "attempt_id": stale.attempt_id}}}},
        raise_on_error=False,
    )

    assert not result.success
    failure = [e for e in result.all_events if e.is_step_failure][0]
    assert "no longer holds the job" in str(failure.event_specific_data.error)
    assert store.job_actions(job_id) == []


def _no_spark():
    from runstate.defs.spark import SparkResource

    return SparkResource(master="invalid://never-started")  # a fenced-out run must not even start Spark


def test_submit_maintenance_queues_a_job_and_returns_the_active_one_on_resubmit(resource):
    config = {"ops": {"submit_maintenance_request": {"config": {"table": "db.t1", "dry_run": True,
                                                               "retain_last": 3}}}}

    first = submit_maintenance.execute_in_process(run_config=config, resources={"maintenance": resource})
    second = submit_maintenance.execute_in_process(run_config=config, resources={"maintenance": resource})

    job_id = first.output_for_node("submit_maintenance_request")
    assert second.output_for_node("submit_maintenance_request") == job_id
    job = resource.get_store().get_job(job_id)
    assert job.dry_run and job.options == {"retain_last": 3} and job.status == "pending"


@pytest.mark.parametrize("overrides, fragment", [
    ({"table": "db.t1; DROP TABLE jobs"}, "not a valid identifier"),
    ({"table": "db.t1", "actions": ["vacuum"]}, "unknown maintenance action"),
    ({"table": "db.t1", "rewrite_strategy": "sort", "sort_order": "id'--"}, "sort_order term"),
    ({"table": "db.not_cached"}, "not in the catalog cache"),
])
def test_submit_maintenance_refuses_bad_input_and_writes_nothing(resource, overrides, fragment):
    config = {"ops": {"submit_maintenance_request": {"config": overrides}}}

    result = submit_maintenance.execute_in_process(run_config=config, resources={"maintenance": resource},
                                                   raise_on_error=False)

    assert not result.success
    failure = [e for e in result.all_events if e.is_step_failure][0]
    assert fragment in str(failure.event_specific_data.error)
    assert resource.get_store().list_jobs() == []


def test_sweep_jobs_run_against_the_store(resource):
    store = resource.get_store()
    assert store.acquire_table_lock("db.t0", "gone-worker", ttl_seconds=0.001)
    defs = build_defs({"maintenance": resource, "spark": _no_spark()})

    swept = defs.resolve_job_def("maintenance_lock_sweep").execute_in_process()
    claims = defs.resolve_job_def("maintenance_claim_sweep").execute_in_process()
    pruned = defs.resolve_job_def("maintenance_health_retention").execute_in_process()

    assert swept.output_for_node("sweep_expired_locks") == 1 and store.table_lock("db.t0") is None
    assert claims.success and pruned.success
