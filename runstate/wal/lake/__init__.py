"""Dataset tables: every WAL dataset as the Iceberg table `lake.datasets.<name>`, merged on Spark.

Plain Python over a SparkSession passed in by the caller; never imports dagster. The blobs are read
inside Spark tasks (boto3 in `mapInArrow`), so no row passes through the driver process.
"""

from runstate.wal.lake.errors import LakeError, VersionNotFound
from runstate.wal.lake.merge import MergeResult, merge_dataset, rebuild_dataset
from runstate.wal.lake.naming import (
    DATASET_PROPERTY,
    MAINTENANCE_ENABLED_PROPERTY,
    NAMESPACE,
    VERSION_KEY,
    VERSION_PROPERTY,
    table_ident,
    table_name,
)
from runstate.wal.lake.read import live_rows_sql, read_table
from runstate.wal.lake.shards import merge_shard
from runstate.wal.lake.source import BlobLocation

__all__ = [
    "BlobLocation",
    "DATASET_PROPERTY",
    "LakeError",
    "MAINTENANCE_ENABLED_PROPERTY",
    "MergeResult",
    "NAMESPACE",
    "VERSION_KEY",
    "VERSION_PROPERTY",
    "VersionNotFound",
    "live_rows_sql",
    "merge_dataset",
    "merge_shard",
    "read_table",
    "rebuild_dataset",
    "table_ident",
    "table_name",
]
