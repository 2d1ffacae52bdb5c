"""End to end through Dagster on real Spark + Iceberg and Postgres:
inventory -> orchestrator schedule tick submits -> queue sensor tick claims and runs
iceberg_maintenance -> the table is compacted, its health recovers and its rows are unchanged."""

from __future__ import annotations

import dagster as dg
import pytest

from runstate.commands.ticking import tick_schedule, tick_sensor
from runstate.defs.maintenance import build_defs
from runstate.defs.maintenance.assets import table_health, table_inventory
from runstate.defs.maintenance.resources import MaintenanceResource
from runstate.defs.spark import SparkResource
from runstate.defs.tags import MAINTENANCE_WORKER_TAG
from runstate.maintenance.identifiers import TableRef
from runstate_tests.support.maintenance import make_table as shared_make_table

pytestmark = pytest.mark.spark


def make_table(spark, namespace: str, name: str, *, files: int, rows: int, enabled: str | None) -> TableRef:
    # position deletes in every file
    return shared_make_table(spark, namespace, name, files=files, rows=rows, deletes=True, enabled=enabled)


def contents(spark, ref: TableRef) -> list[tuple]:
    return [tuple(r) for r in spark.sql(f"SELECT id, v FROM lake.{ref.quoted} ORDER BY id").collect()]


@pytest.fixture
def resources(pg_database, pg_schema, spark_settings, spark):
    return {
        "maintenance": MaintenanceResource(
            dsn=pg_database, pg_schema=pg_schema, lease_seconds=120, max_worker_runs=2
        ),
        # getOrCreate hands back the worker's session: same catalog and warehouse.
        "spark": SparkResource(pg_url=spark_settings.pg_url, warehouse_dir=str(spark_settings.warehouse_dir)),
    }


def test_unhealthy_table_is_compacted_end_to_end(spark, iceberg_namespace, resources):
    ref = make_table(spark, iceberg_namespace, "events", files=30, rows=3000, enabled="true")
    bystander = make_table(spark, iceberg_namespace, "plain", files=6, rows=60, enabled=None)
    rows_before = contents(spark, ref)
    defs = build_defs(resources)
    instance = dg.DagsterInstance.ephemeral()
    store = resources["maintenance"].get_store()

    inventory = dg.materialize([table_inventory], resources=resources, instance=instance)
    assert inventory.success
    assert {ref.key, bystander.key} <= set(instance.get_dynamic_partitions("tables"))
    cached = {
        c.table_key: c.maintenance_enabled
        for c in store.cache.cached_tables()
        if c.database == iceberg_namespace
    }
    assert cached == {ref.key: True, bystander.key: None} and store.cache.last_synced_at() is not None

    planned = tick_schedule("maintenance_orchestrator", defs=defs, instance=instance)
    assert planned.succeeded == 1
    run = store.history.orchestrator_runs(limit=1)[0]
    others = (
        len(store.cache.cached_tables()) - 2
    )  # tables other tests of this worker left in the catalog, if any
    assert (run.status, run.tables_assessed, run.tables_skipped, run.jobs_submitted) == (
        "completed",
        2 + others,
        1 + others,
        1,
    )
    job = store.queue.active_job(ref)
    assert job.actions == ("rewrite_data_files", "rewrite_position_delete_files")
    assert job.options == {"delete_file_threshold": 1}
    unhealthy = store.history.latest_health(ref)
    assert (unhealthy.total_data_files, unhealthy.total_delete_files) == (30, 30)
    assert unhealthy.needs_maintenance and unhealthy.health_status == "NeedsMaintenance"

    ticked = tick_sensor("maintenance_queue_sensor", defs=defs, instance=instance)
    assert (ticked.requested, ticked.succeeded, ticked.failed) == (1, 1, 0)
    done = store.queue.get_job(job.job_id)
    assert done.status == "completed"
    maintenance_run = ticked.results[0].dagster_run
    assert maintenance_run.tags[MAINTENANCE_WORKER_TAG] == "true"
    actions = store.queue.job_actions(job.job_id)
    assert [(a.action, a.success) for a in actions] == [
        ("rewrite_data_files", True),
        ("rewrite_position_delete_files", True),
    ]
    # What the job achieved, in job_actions and in the run's metadata.
    assert (actions[0].before["data_files"], actions[-1].after["data_files"]) == (30, 1)
    assert (actions[0].before["delete_files"], actions[-1].after["delete_files"]) == (30, 0)
    [output] = [e for e in ticked.results[0].all_events if e.event_type_value == "STEP_OUTPUT"]
    metadata = output.event_specific_data.metadata
    assert (metadata["data_files_before"].value, metadata["data_files_after"].value) == (30, 1)
    job_figures = metadata[f"job {job.job_id}"].value
    assert job_figures["status"] == "completed"
    assert (
        job_figures["actions"][0]["after"]["snapshot_id"]
        != job_figures["actions"][0]["before"]["snapshot_id"]
    )

    health = dg.materialize(
        [table_health],
        partition_key=ref.key,
        resources=resources,
        instance=instance,
        selection=[table_health],
    )
    assert health.success
    healed = store.history.latest_health(ref)
    assert (healed.total_data_files, healed.total_delete_files) == (1, 0)
    assert healed.health_status == "Healthy" and not healed.needs_maintenance
    check = health.get_asset_check_evaluations()[0]
    assert check.check_name == "table_is_healthy" and check.passed
    assert contents(spark, ref) == rows_before

    assert tick_sensor("maintenance_queue_sensor", defs=defs, instance=instance).requested == 0
    tick_schedule("maintenance_orchestrator", defs=defs, instance=instance)
    again = store.history.orchestrator_runs(limit=1)[0]
    # Its job only applied delete files, which does not hold back the cadence: assessed again, healthy.
    assert (again.tables_skipped, again.jobs_submitted) == (1 + others, 0)
    assert (
        store.history.latest_health(ref).id != healed.id
        and store.history.latest_health(ref).health_status == "Healthy"
    )
