"""`dataset_snapshots`: one dynamic partition per dataset; materializing one rebuilds it from its WAL history."""

from datetime import timedelta

import dagster as dg

from runstate.defs.wal.partitions import datasets_partitions
from runstate.defs.wal.resources import WalResource
from runstate.wal import rebuild_snapshot

# Flush runs materialize a dataset's partition within seconds of its appends; an hour without any is the
# wal_lag check's bound too. Dagster judges the asset's latest materialization of any partition, so a quiet
# WAL (no appends) reads as behind: the wal_lag check says whether rows are actually waiting.
SNAPSHOTS_FRESHNESS = dg.FreshnessPolicy.time_window(
    fail_window=timedelta(hours=1), warn_window=timedelta(minutes=10)
)


@dg.asset(
    partitions_def=datasets_partitions,
    group_name="wal",
    freshness_policy=SNAPSHOTS_FRESHNESS,
    description="The latest snapshot blob of each dataset. Flush runs record a materialization per delta; "
    "materializing a partition (or backfilling them all) rebuilds the snapshot from the dataset's WAL history.",
)
def dataset_snapshots(context: dg.AssetExecutionContext, wal: WalResource) -> dg.MaterializeResult:
    dataset_id = context.partition_key
    result = rebuild_snapshot(wal.wal_table(), wal.blob_store(), dataset_id)
    context.log.info(f"dataset {dataset_id!r}: rebuilt snapshot {result}")
    return dg.MaterializeResult(metadata=result_metadata(result))


def result_metadata(result: object) -> dict[str, object]:
    """Every scalar field of a core result, as materialization metadata."""
    fields = vars(result) if hasattr(result, "__dict__") else {}
    return {name: value for name, value in fields.items() if isinstance(value, (bool, int, float, str))}
