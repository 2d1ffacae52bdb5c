"""Issue 42.8: a dead run of a sensor-driven job gets one replacement, its sensor's, never a run retry too.

After a kill -9 of the deployment mid-merge, each killed merge (and failed flush) shard got two
replacement runs: the daemon's `run_retries` retry and a fresh sensor request. The jobs that a sensor
re-plans opt out of run retries (`dagster/max_retries: 0`); the others keep the instance's retries.
The verdict is Dagster's own, the function its run-retry daemon calls.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from dagster._core.execution.retries import auto_reexecution_should_retry_run

from runstate.definitions import defs
from runstate.defs.maintenance.resources import MaintenanceResource
from runstate.defs.maintenance.sensors import maintenance_queue_sensor
from runstate.defs.tags import MAX_RETRIES_TAG
from runstate.maintenance.models import CachedTable

RETRYING_INSTANCE = "run_retries:\n  enabled: true\n  max_retries: 3\ntelemetry:\n  enabled: false\n"


@pytest.fixture
def instance(tmp_path: Path):
    (tmp_path / "dagster.yaml").write_text(RETRYING_INSTANCE)
    with dg.DagsterInstance.from_config(str(tmp_path)) as inst:
        yield inst


CONFIG = {
    "flush_wal": {"ops": {"flush_wal_shard": {"config": {"batches": [], "shard": 0}}}},
    "merge_dataset_tables": {"ops": {"merge_datasets": {"config": {"dataset_ids": ["orders"]}}}},
}


def failed_run(
    instance: dg.DagsterInstance, job_name: str, tags: dict[str, str] | None = None
) -> dg.DagsterRun:
    job = defs.resolve_job_def(job_name)
    run = instance.create_run_for_job(job, tags={**job.tags, **(tags or {})}, run_config=CONFIG.get(job_name))
    instance.report_run_failed(run, "its worker was killed with the deployment")
    return instance.get_run_by_id(run.run_id)


@pytest.mark.parametrize("job_name", ["flush_wal", "merge_dataset_tables"])
def test_the_jobs_a_sensor_replans_are_not_retried_by_the_daemon(instance, job_name):
    run = failed_run(instance, job_name)

    assert run.tags[MAX_RETRIES_TAG] == "0"
    assert not auto_reexecution_should_retry_run(instance, run, None)


def test_a_maintenance_worker_run_requested_by_its_sensor_is_not_retried(instance, pg_database, pg_schema):
    maintenance = MaintenanceResource(dsn=pg_database, pg_schema=pg_schema, max_worker_runs=1)
    store = maintenance.get_store()
    store.cache.replace_table_cache([CachedTable("db", "t", True, {})])
    store.submit("db", "t", ["rewrite_manifests"])
    with dg.build_sensor_context(
        resources={"maintenance": maintenance}, instance=dg.DagsterInstance.ephemeral()
    ) as context:
        [request] = maintenance_queue_sensor(context).run_requests
    store.close()

    run = failed_run(instance, "iceberg_maintenance", request.tags)

    assert not auto_reexecution_should_retry_run(instance, run, None)


def test_other_jobs_keep_the_instances_run_retries(instance):
    run = failed_run(instance, "table_inventory_job")

    assert auto_reexecution_should_retry_run(instance, run, None)
