"""apply_deletes_sensor: dataset tables whose merges left many delete files get one job applying them.

The materializations are the ones a merge run logs (merge_metadata of a MergeResult); the store is real.
That a merge reports its table's delete files is runstate_tests/wal/dataset_tables/test_merge.py's."""

from __future__ import annotations

import dagster as dg
import pytest

from runstate.defs.dataset_tables.jobs import TABLES_ASSET, merge_metadata
from runstate.defs.maintenance.apply_deletes import apply_deletes_sensor
from runstate.defs.maintenance.resources import MaintenanceResource
from runstate.maintenance.identifiers import APPLY_DELETES_ACTIONS
from runstate.maintenance.models import CachedTable
from runstate.wal.dataset_tables import MergeResult, TableFiles


@pytest.fixture
def resource(pg_database, pg_schema):
    res = MaintenanceResource(dsn=pg_database, pg_schema=pg_schema, apply_deletes_at=20)
    yield res
    res.get_store().close()


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as instance:
        yield instance


def merged(instance: dg.DagsterInstance, name: str, delete_files: int) -> None:
    """What a merge run logs for the table `lake.datasets.<name>` after its commit."""
    files = TableFiles(data_files=delete_files + 1, delete_files=delete_files, records_added=5)
    result = MergeResult(name, f"lake.datasets.{name}", 1, 2, 1, False, 5, 0.1, files)
    instance.report_runless_asset_event(
        dg.AssetMaterialization(TABLES_ASSET, partition=name, metadata=merge_metadata(result))
    )


def tick(resource, instance, cursor):
    with dg.build_sensor_context(
        resources={"maintenance": resource}, instance=instance, cursor=cursor
    ) as context:
        result = apply_deletes_sensor(context)
    return result, result.cursor


def test_a_table_over_the_threshold_gets_one_job_and_the_rest_none(resource, instance):
    store = resource.get_store()
    store.cache.replace_table_cache(
        [CachedTable("datasets", "busy", True), CachedTable("datasets", "off", False)]
    )
    merged(instance, "early", 30)  # before the sensor's first tick: it starts after the newest
    _, cursor = tick(resource, instance, None)
    merged(instance, "busy", 19)
    merged(instance, "quiet", 3)
    merged(instance, "off", 40)  # opted out since
    below, cursor = tick(resource, instance, cursor)
    assert store.queue.list_jobs() == []
    assert below.skip_reason.skip_message == "datasets.off: runstate.maintenance.enabled is not true"

    merged(instance, "busy", 20)
    merged(instance, "fresh", 25)  # not in the catalog cache yet: added, as created (opted in)
    result, cursor = tick(resource, instance, cursor)

    jobs = {(job.database, job.table): job for job in store.queue.list_jobs()}
    assert set(jobs) == {("datasets", "busy"), ("datasets", "fresh")}
    assert all(job.actions == APPLY_DELETES_ACTIONS for job in jobs.values())
    assert all(job.options == {"delete_file_threshold": 1} for job in jobs.values())
    assert "datasets.busy: job" in result.skip_reason.skip_message
    assert {t.table_key: t.maintenance_enabled for t in store.cache.cached_tables()}["datasets.fresh"] is True

    merged(instance, "busy", 21)  # the next merge, while the job is still pending: the same job
    again, cursor = tick(resource, instance, cursor)
    assert (
        len(store.queue.list_jobs()) == 2
        and jobs[("datasets", "busy")].job_id in again.skip_reason.skip_message
    )
    nothing, _ = tick(resource, instance, cursor)
    assert "no dataset table merged since the last tick" in nothing.skip_reason.skip_message


def test_zero_turns_the_sensor_off(resource, instance):
    resource = MaintenanceResource(dsn=resource.dsn, pg_schema=resource.pg_schema, apply_deletes_at=0)
    merged(instance, "busy", 500)
    with dg.build_sensor_context(resources={"maintenance": resource}, instance=instance) as context:
        assert isinstance(apply_deletes_sensor(context), dg.SkipReason)
