"""Dataset tables: every WAL dataset as the Iceberg table `lake.datasets.<name>`, merged on Spark.

Plain Python over a SparkSession passed in by the caller; never imports dagster. The blobs are read
inside Spark tasks (boto3 in `mapInArrow`), so no row passes through the driver process.
"""

from runstate.wal.dataset_tables.errors import DatasetTableError, VersionNotFound
from runstate.wal.dataset_tables.merge import MergeResult, merge_dataset, rebuild_dataset
from runstate.wal.dataset_tables.naming import (
    DATASET_PROPERTY,
    MAINTENANCE_ENABLED_PROPERTY,
    NAMESPACE,
    VERSION_KEY,
    VERSION_PROPERTY,
    table_ident,
    table_name,
)
from runstate.wal.dataset_tables.read import live_rows_sql, read_table
from runstate.wal.dataset_tables.source import BlobLocation
from runstate.wal.dataset_tables.table import TableFiles

__all__ = [
    "BlobLocation",
    "DATASET_PROPERTY",
    "DatasetTableError",
    "MAINTENANCE_ENABLED_PROPERTY",
    "MergeResult",
    "NAMESPACE",
    "TableFiles",
    "VERSION_KEY",
    "VERSION_PROPERTY",
    "VersionNotFound",
    "live_rows_sql",
    "merge_dataset",
    "read_table",
    "rebuild_dataset",
    "table_ident",
    "table_name",
]
