"""run_job on real Spark + Iceberg with the real MaintenanceStore: locks, cancel, fences, dry runs."""

from __future__ import annotations

import pytest

from runstate.maintenance.catalog import list_tables
from runstate.maintenance.errors import TableLocked
from runstate.maintenance.identifiers import TableRef
from runstate.maintenance.models import CachedTable
from runstate.maintenance.runner import run_job
from runstate.maintenance.store import MaintenanceStore
from runstate_tests.support.maintenance import make_table as shared_make_table

pytestmark = pytest.mark.spark


def make_table(spark, namespace: str, name: str = "events", **knobs) -> TableRef:
    return shared_make_table(spark, namespace, name, **{"files": 12, "rows": 1200, "deletes": True, **knobs})


def data_files(spark, ref: TableRef) -> int:
    return spark.table(f"lake.{ref.quoted}.data_files").count()


def cache(store: MaintenanceStore, ref: TableRef) -> None:
    store.cache.replace_table_cache([CachedTable(ref.database, ref.table, True, {})])


ALL = ["rewrite_data_files", "rewrite_position_delete_files", "rewrite_manifests"]


def test_a_job_runs_its_actions_in_order_and_completes_under_its_fence(spark, iceberg_namespace, store):
    ref = make_table(spark, iceberg_namespace)
    cache(store, ref)
    job_id = store.submit(ref.database, ref.table, list(reversed(ALL)))
    claim = store.claim("worker-1", lease_seconds=120)

    outcome = run_job(spark, store, claim)

    assert outcome.status == "completed", outcome.error
    assert [a.action for a in store.queue.job_actions(job_id)] == ALL
    assert all(a.success and "=" in a.message for a in store.queue.job_actions(job_id))
    assert store.queue.get_job(job_id).status == "completed"
    assert store.locks.table_lock(ref) is None
    assert data_files(spark, ref) == 1


def test_a_live_lock_blocks_a_second_job_on_the_table(spark, iceberg_namespace, store):
    ref = make_table(spark, iceberg_namespace, files=6, rows=600)
    cache(store, ref)
    assert store.acquire_table_lock(ref.key, "job-already-running", ttl_seconds=600)
    job_id = store.submit(ref.database, ref.table, ["rewrite_data_files"])
    claim = store.claim("worker-1", lease_seconds=120)

    with pytest.raises(TableLocked, match=ref.key):
        run_job(spark, store, claim)

    assert store.queue.job_actions(job_id) == []
    assert store.queue.get_job(job_id).status == "running"  # its lease runs out, then it is claimed again
    assert store.locks.table_lock(ref)["holder"] == "job-already-running"
    assert data_files(spark, ref) == 6


def test_cancel_between_actions_stops_the_job(spark, iceberg_namespace, store):
    ref = make_table(spark, iceberg_namespace, files=6, rows=600)
    cache(store, ref)
    job_id = store.submit(ref.database, ref.table, ALL)
    claim = store.claim("worker-1", lease_seconds=120)
    requested = []

    def cancel_after_first(result):
        requested.append(store.cancel(job_id))

    outcome = run_job(spark, store, claim, after_action=cancel_after_first)

    assert requested[0] == "cancel_requested"
    assert outcome.status == "cancelled"
    assert [a.action for a in store.queue.job_actions(job_id)] == ["rewrite_data_files"]
    job = store.queue.get_job(job_id)
    assert job.status == "cancelled" and job.completed_at is not None
    assert spark.table(f"lake.{ref.quoted}.delete_files").count() == 6  # the second action never ran


def test_a_fenced_out_worker_stops_and_changes_nothing(spark, iceberg_namespace, store):
    ref = make_table(spark, iceberg_namespace, files=6, rows=600)
    cache(store, ref)
    job_id = store.submit(ref.database, ref.table, ALL)
    stale = store.claim("worker-1", lease_seconds=0.001)  # the lease is gone at once
    fresh = store.claim("worker-2", lease_seconds=120)
    assert fresh.job_id == job_id

    outcome = run_job(spark, store, stale)

    assert outcome.status == "fenced_out"
    assert store.queue.job_actions(job_id) == []
    assert data_files(spark, ref) == 6  # no procedure ran under the dead lease
    assert store.queue.get_job(job_id).attempt_id == fresh.attempt_id
    assert run_job(spark, store, fresh).status == "completed"


def test_a_dry_run_job_records_plans_and_writes_nothing_to_the_table(spark, iceberg_namespace, store):
    ref = make_table(spark, iceberg_namespace, files=6, rows=600)
    cache(store, ref)
    snapshots_before = spark.table(f"lake.{ref.quoted}.snapshots").collect()
    job_id = store.submit(ref.database, ref.table, ALL, dry_run=True)

    outcome = run_job(spark, store, store.claim("worker-1", lease_seconds=120))

    assert outcome.status == "completed"
    messages = [a.message for a in store.queue.job_actions(job_id)]
    assert messages[0].startswith("dry run: would_rewrite_data_files_count=6")
    assert spark.table(f"lake.{ref.quoted}.snapshots").collect() == snapshots_before


def test_catalog_listing_reads_the_opt_in_and_cadence_properties(spark, iceberg_namespace):
    ref = make_table(spark, iceberg_namespace, files=1, rows=10)
    spark.sql(f"ALTER TABLE lake.{ref.quoted} SET TBLPROPERTIES ('runstate.maintenance.cadence-hours'='6')")
    spark.sql(f"CREATE TABLE lake.`{iceberg_namespace}`.plain (id BIGINT) USING iceberg")
    spark.sql(
        f"CREATE TABLE lake.`{iceberg_namespace}`.odd (id BIGINT) USING iceberg "
        "TBLPROPERTIES ('runstate.maintenance.enabled'='sometimes')"
    )

    tables = {t.table: t for t in list_tables(spark).tables if t.database == iceberg_namespace}

    assert tables["events"].maintenance_enabled is True
    assert tables["events"].cadence_hours == 6
    assert tables["plain"].maintenance_enabled is None
    assert tables["odd"].maintenance_enabled is None
    assert tables["events"].cached().payload["maintenance_cadence_hours"] == 6


def test_catalog_listing_leaves_out_a_listed_table_it_cannot_read(spark, spark_settings, iceberg_namespace):
    """A catalog entry whose metadata is gone (a table dropped by hand, a warehouse restored in part) is
    named and left out; the rest of the catalog is still listed."""
    make_table(spark, iceberg_namespace, files=1, rows=10)
    spark.sql(f"CREATE TABLE lake.`{iceberg_namespace}`.broken (id BIGINT) USING iceberg")
    broken = spark_settings.warehouse_dir / iceberg_namespace / "broken"
    broken.rename(broken.with_name("aside"))  # moved back after the listing, so the teardown can drop it
    spark.sql(f"REFRESH TABLE lake.`{iceberg_namespace}`.broken")  # out of this session's table cache
    try:
        listing = list_tables(spark)
    finally:
        broken.with_name("aside").rename(broken)

    assert [t.table for t in listing.tables if t.database == iceberg_namespace] == ["events"]
    [skipped] = [name for name in listing.skipped if name.startswith(f"{iceberg_namespace}.broken")]
    assert "NotFoundException" in skipped, skipped
