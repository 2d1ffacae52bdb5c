"""`dataset_tables`: one dynamic partition per dataset; materializing one rebuilds its Iceberg table."""

from datetime import timedelta

import dagster as dg

from runstate.defs.dataset_tables.jobs import merge_metadata
from runstate.defs.dataset_tables.resources import blob_location, copy_on_write_max_bytes
from runstate.defs.spark import SparkResource, ends_spark_session
from runstate.defs.tags import SPARK_POOL
from runstate.defs.wal.assets import dataset_snapshots
from runstate.defs.wal.partitions import datasets_partitions
from runstate.defs.wal.resources import WalResource
from runstate.wal.dataset_tables import merge_dataset

GROUP = "datasets"
# A backfill of every dataset runs in ceil(datasets / 25) runs, each on one Spark session.
DATASETS_PER_BACKFILL_RUN = 25


def tables_freshness(merge_interval_s: int) -> dg.FreshnessPolicy:
    """While datasets change, a table is one merge interval (RUNSTATE_DATASET_MERGE_INTERVAL_S) plus a merge
    behind its blobs: late after 3 intervals without a merge, behind after 10 (Dagster's floor is a minute).
    Dagster judges the asset's latest materialization of any table, and a merge of a table that was already
    current is an observation: when no dataset changes, the asset reads as behind too."""
    return dg.FreshnessPolicy.time_window(
        fail_window=timedelta(seconds=max(120, 10 * merge_interval_s)),
        warn_window=timedelta(seconds=max(60, 3 * merge_interval_s)),
    )


@dg.asset(
    partitions_def=datasets_partitions,
    deps=[dataset_snapshots],
    group_name=GROUP,
    pool=SPARK_POOL,
    backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=DATASETS_PER_BACKFILL_RUN),
    description="Each dataset as the Iceberg table lake.datasets.<name> (key, value JSON, wal_seq, "
    "updated_at, deleted); live rows: WHERE NOT deleted. merge_dataset_tables keeps it current after "
    "flushes; materializing (or backfilling) partitions rebuilds their tables from the snapshot plus every "
    "delta, on Spark.",
)
@ends_spark_session
def dataset_tables(
    context: dg.AssetExecutionContext, wal: WalResource, spark: SparkResource
) -> dg.MaterializeResult:
    session, location, s3 = spark.get_session(), blob_location(wal), wal.s3_client()
    limit = copy_on_write_max_bytes(wal)
    results = [
        merge_dataset(session, location, dataset_id, rebuild=True, s3=s3, copy_on_write_max_bytes=limit)
        for dataset_id in context.partition_keys
    ]
    for result in results:
        context.log.info(f"dataset {result.dataset_id!r}: rebuilt {result.table} at version {result.version}")
    if len(results) == 1:
        return dg.MaterializeResult(metadata=merge_metadata(results[0]))
    return dg.MaterializeResult(
        metadata={
            "datasets": len(results),
            "versions": dg.MetadataValue.json({r.dataset_id: r.version for r in results}),
            "rows_written": sum(r.rows_written for r in results),
        }
    )
