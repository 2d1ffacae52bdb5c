"""`table_health_sync`: one run that measures every cached table, opted in or not, and reports each
result as a `table_health` materialization of that table's partition (so the UI shows every table)."""

import dagster as dg

from runstate.defs.maintenance.assets import health_metadata, sync_table_partitions, table_health
from runstate.defs.maintenance.resources import MaintenanceResource
from runstate.defs.spark import SparkResource, ends_spark_session
from runstate.defs.tags import SPARK_JOB_TAGS, SPARK_POOL
from runstate.maintenance.errors import TableNotFound
from runstate.maintenance.health import HealthAnalyzer


@dg.op(
    pool=SPARK_POOL,
    description="Analyze every cached table; one health_snapshots row and table_health materialization each.",
)
@ends_spark_session
def sync_table_health(
    context: dg.OpExecutionContext, spark: SparkResource, maintenance: MaintenanceResource
) -> dict:
    store = maintenance.get_store()
    tables = store.cache.cached_tables()
    if not tables:
        context.add_output_metadata({"tables": 0})
        return {"tables": 0, "missing": 0}
    # Partitions for tables the inventory added since the last table_inventory materialization.
    existing = set(context.instance.get_dynamic_partitions(table_health.partitions_def.name))
    sync_table_partitions(context.instance, existing | {t.table_key for t in tables})
    analyzer = HealthAnalyzer(spark.get_session(), maintenance.thresholds())
    measured, missing = 0, []
    for entry in tables:
        try:
            health = analyzer.analyze(entry.ref)
        except TableNotFound:
            missing.append(entry.table_key)  # dropped since the inventory; the next sync forgets it
            continue
        snapshot_id = store.history.insert_health_snapshot(health)
        context.log_event(
            dg.AssetMaterialization(
                asset_key=table_health.key,
                partition=entry.table_key,
                metadata=health_metadata(health, snapshot_id),
            )
        )
        measured += 1
    context.add_output_metadata({"tables": measured, "missing": ", ".join(missing) or "none"})
    return {"tables": measured, "missing": len(missing)}


@dg.job(
    description="Health of every cached table (opted in or not), as table_health materializations.",
    tags=SPARK_JOB_TAGS,
)
def table_health_sync() -> None:
    sync_table_health()


table_health_sync_schedule = dg.ScheduleDefinition(
    name="table_health_sync",
    cron_schedule="20 * * * *",
    job=table_health_sync,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Hourly: measure every table in the catalog cache and record its health.",
)
