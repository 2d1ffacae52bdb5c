"""table_health_sync: one run measures every cached table, opted in or not, and each result is a
table_health materialization of that table's partition with numeric metadata the UI can plot."""

from __future__ import annotations

import dagster as dg
import pytest

from runstate.defs.maintenance import build_defs
from runstate.defs.maintenance.resources import MaintenanceResource
from runstate.defs.spark import SparkResource
from runstate.maintenance.models import CachedTable
from runstate_tests.support.maintenance import make_table

pytestmark = pytest.mark.spark
NUMERIC = {
    "data_files": int,
    "avg_file_size_bytes": float,
    "delete_files": int,
    "delete_ratio": float,
    "manifests": int,
    "snapshots": int,
    "oldest_snapshot_age_hours": float,
}


def test_every_cached_table_gets_a_table_health_materialization(
    spark, spark_settings, iceberg_namespace, pg_database, pg_schema
):
    opted_in = make_table(spark, iceberg_namespace, "opted", files=4, rows=40, deletes=True)
    plain = make_table(spark, iceberg_namespace, "plain", files=2, rows=20)
    maintenance = MaintenanceResource(dsn=pg_database, pg_schema=pg_schema)
    store = maintenance.get_store()
    store.cache.replace_table_cache(
        [CachedTable(opted_in.database, opted_in.table, True, {}), CachedTable(plain.database, plain.table)]
    )
    spark_resource = SparkResource(
        pg_url=spark_settings.pg_url, warehouse_dir=str(spark_settings.warehouse_dir)
    )
    defs = build_defs({"maintenance": maintenance, "spark": spark_resource})
    instance = dg.DagsterInstance.ephemeral()

    result = defs.resolve_job_def("table_health_sync").execute_in_process(instance=instance)

    assert result.success
    events = instance.fetch_materializations(dg.AssetKey("table_health"), limit=10).records
    by_partition = {e.asset_materialization.partition: e.asset_materialization.metadata for e in events}
    assert set(by_partition) == {opted_in.key, plain.key}
    for metadata in by_partition.values():
        for name, kind in NUMERIC.items():
            assert isinstance(metadata[name].value, kind), (name, metadata[name])
    assert by_partition[opted_in.key]["data_files"].value == 4
    opted = by_partition[opted_in.key]
    assert opted["delete_files"].value > 0
    assert opted["delete_ratio"].value == opted["delete_files"].value / opted["data_files"].value
    assert by_partition[plain.key]["delete_files"].value == 0
    assert {opted_in.key, plain.key} <= set(instance.get_dynamic_partitions("tables"))
    assert store.history.latest_health(plain).total_data_files == 2
    maintenance.get_store().close()
