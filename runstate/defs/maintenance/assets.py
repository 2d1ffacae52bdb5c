"""`table_inventory` (the catalog copied into the cache) and `table_health` (one partition per table)."""

from datetime import timedelta

import dagster as dg

from runstate.defs.maintenance.checks import TABLE_IS_HEALTHY, table_is_healthy
from runstate.defs.maintenance.resources import MaintenanceResource
from runstate.defs.spark import SparkResource, ends_spark_session
from runstate.defs.tags import SPARK_POOL
from runstate.maintenance.catalog import list_tables
from runstate.maintenance.health import HealthAnalyzer
from runstate.maintenance.identifiers import parse_table_ref
from runstate.maintenance.models import HealthSnapshot

GROUP = "maintenance"
tables_partitions = dg.DynamicPartitionsDefinition(name="tables")
# The inventory runs hourly at :50 (before the orchestrator reads the cache on the hour), by its
# AutomationCondition, not a schedule. Its upstream (dataset_tables, the lineage's edge) does not gate it.
INVENTORY_CRON = "50 * * * *"
# Hourly work (the inventory; table_health_sync measures every table at :20): one missed hour warns, two fail.
HOURLY_FRESHNESS = dg.FreshnessPolicy.time_window(
    fail_window=timedelta(hours=2), warn_window=timedelta(minutes=70)
)


@dg.asset(
    group_name=GROUP,
    pool=SPARK_POOL,
    freshness_policy=HOURLY_FRESHNESS,
    automation_condition=dg.AutomationCondition.on_cron(INVENTORY_CRON).ignore(
        dg.AssetSelection.assets("dataset_tables")
    ),
    description="Every table of the `lake` catalog, copied atomically into table_cache_entries.",
)
@ends_spark_session
def table_inventory(
    context: dg.AssetExecutionContext, spark: SparkResource, maintenance: MaintenanceResource
) -> dg.MaterializeResult:
    listing = list_tables(spark.get_session())
    stored = maintenance.get_store().cache.replace_table_cache([table.cached() for table in listing.tables])
    added, removed = sync_table_partitions(context.instance, {table.key for table in listing.tables})
    return dg.MaterializeResult(
        metadata={
            "tables": stored,
            "opted_in": sum(1 for t in listing.tables if t.maintenance_enabled),
            "partitions_added": len(added),
            "partitions_removed": len(removed),
            "skipped_names": ", ".join(listing.skipped) or "none",
        }
    )


def sync_table_partitions(instance: dg.DagsterInstance, keys: set[str]) -> tuple[list[str], list[str]]:
    """One `tables` partition per catalog table, so table_health can be backfilled across tables."""
    existing = set(instance.get_dynamic_partitions(tables_partitions.name))
    added, removed = sorted(keys - existing), sorted(existing - keys)
    if added:
        instance.add_dynamic_partitions(tables_partitions.name, added)
    for key in removed:
        instance.delete_dynamic_partition(tables_partitions.name, key)
    return added, removed


@dg.asset(
    group_name=GROUP,
    partitions_def=tables_partitions,
    pool=SPARK_POOL,
    freshness_policy=HOURLY_FRESHNESS,
    deps=[table_inventory],
    check_specs=[TABLE_IS_HEALTHY],
    description=(
        "Health of one table from its Iceberg metadata tables;"
        " each materialization appends a health_snapshots row."
    ),
)
@ends_spark_session
def table_health(
    context: dg.AssetExecutionContext, spark: SparkResource, maintenance: MaintenanceResource
) -> dg.MaterializeResult:
    ref = parse_table_ref(context.partition_key)
    health = HealthAnalyzer(spark.get_session(), maintenance.thresholds()).analyze(ref)
    snapshot_id = maintenance.get_store().history.insert_health_snapshot(health)
    return dg.MaterializeResult(
        metadata=health_metadata(health, snapshot_id), check_results=[table_is_healthy(health)]
    )


def health_metadata(health: HealthSnapshot, snapshot_id: int) -> dict[str, dg.MetadataValue]:
    """A table_health materialization's metadata; the numbers are typed so the UI plots them over time."""
    return {
        "health_snapshot_id": dg.MetadataValue.int(snapshot_id),
        "health_status": dg.MetadataValue.text(health.health_status),
        "needs_maintenance": dg.MetadataValue.bool(health.needs_maintenance),
        "recommended_actions": dg.MetadataValue.text(", ".join(health.recommended_actions) or "none"),
        "data_files": dg.MetadataValue.int(health.total_data_files),
        "avg_file_size_bytes": dg.MetadataValue.float(float(health.avg_file_size_bytes)),
        "delete_files": dg.MetadataValue.int(health.total_delete_files),
        "delete_ratio": dg.MetadataValue.float(float(health.delete_ratio)),
        "small_files": dg.MetadataValue.int(health.small_file_count),
        "total_bytes": dg.MetadataValue.int(health.total_size_bytes),
        "records": dg.MetadataValue.int(health.total_records),
        "manifests": dg.MetadataValue.int(health.manifest_count),
        "snapshots": dg.MetadataValue.int(health.snapshot_count),
        "oldest_snapshot_age_hours": dg.MetadataValue.float(float(health.oldest_snapshot_age_hours)),
        "error": dg.MetadataValue.text(health.error or ""),
    }
