"""A table's figures around a maintenance action: exact numbers of one snapshot, cheaply.

The snapshot id and the manifest count come from the table's metadata and manifest list, read in the
driver (no Spark job). Data files, bytes and delete files come, cheapest first, from the table's latest
health row when that was taken at the same snapshot; from the snapshot's summary totals, which Iceberg
keeps exact on every commit, when the table has no delete files (its `total-files-size` counts delete
files too, so with deletes it is not the data bytes); else from one aggregate over `.files` pinned to
that snapshot. A compaction's own Spark job is then the only one around it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from runstate.maintenance.catalog import CATALOG
from runstate.maintenance.identifiers import TableRef
from runstate.maintenance.models import HealthSnapshot

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Data and delete files with their bytes in one aggregate over `.files` (no grouping, so no shuffle),
# pinned to the snapshot whose manifest list gave the manifest count: every figure is of one snapshot.
_FILES_FIGURES_SQL = (
    "SELECT count_if(content = 0) AS data_files,"
    " coalesce(sum(if(content = 0, file_size_in_bytes, 0)), 0) AS data_bytes,"
    " count_if(content <> 0) AS delete_files"
    " FROM {table}.files VERSION AS OF {snapshot_id}"
)


# The snapshot summary's running totals, kept exact by Iceberg on every commit.
_SUMMARY_TOTALS = {
    "data_files": "total-data-files",
    "delete_files": "total-delete-files",
    "files_bytes": "total-files-size",
}


def iceberg_table(spark: SparkSession, name: str) -> Any:
    """The Iceberg table (a JVM object) behind `name`, loaded in the driver: no Spark job."""
    jvm = spark.sparkContext._jvm
    return jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, name)


def current_snapshot(spark: SparkSession, name: str) -> tuple[int | None, int]:
    """(current snapshot id, its manifest count) from the table's metadata and manifest list, read in
    the driver: no Spark job. (None, 0) for a table without a snapshot."""
    snapshot_id, manifests, _ = _snapshot(spark, name)
    return snapshot_id, manifests


def _snapshot(spark: SparkSession, name: str) -> tuple[int | None, int, dict[str, int] | None]:
    """current_snapshot's figures and the summary's file totals (None when the summary lacks one:
    a snapshot chain started by an engine that did not keep them)."""
    table = iceberg_table(spark, name)
    snapshot = table.currentSnapshot()
    if snapshot is None:
        return None, 0, None
    summary = snapshot.summary()
    totals = {key: summary.get(prop) for key, prop in _SUMMARY_TOTALS.items()}
    known = None if None in totals.values() else {key: int(value) for key, value in totals.items()}
    return int(snapshot.snapshotId()), int(snapshot.allManifests(table.io()).size()), known


def table_figures(
    spark: SparkSession,
    ref: TableRef,
    catalog: str = CATALOG,
    *,
    known: HealthSnapshot | None = None,
    canary_planning: bool = False,
) -> dict[str, Any]:
    """What a job changes, as exact numbers of one snapshot: data files and bytes, delete files,
    manifests. `known` (the table's latest complete health row) answers without a Spark job when it
    was taken at the current snapshot. `canary_planning` adds how long a full scan takes to plan
    (listing the files a read would open, without reading them): a timing, so opt-in."""
    name = ref.in_catalog(catalog)
    snapshot_id, manifests, totals = _snapshot(spark, name)
    figures: dict[str, Any] = {"snapshot_id": snapshot_id, "manifests": manifests}
    if snapshot_id is None:
        figures.update(data_files=0, data_bytes=0, delete_files=0)
    elif known is not None and known.error is None and known.snapshot_id == snapshot_id:
        figures.update(
            data_files=known.total_data_files,
            data_bytes=known.total_size_bytes,
            delete_files=known.total_delete_files,
        )
    elif totals is not None and totals["delete_files"] == 0:
        figures.update(data_files=totals["data_files"], data_bytes=totals["files_bytes"], delete_files=0)
    else:
        row = spark.sql(_FILES_FIGURES_SQL.format(table=name, snapshot_id=snapshot_id)).first()
        figures.update(
            data_files=int(row["data_files"]),
            data_bytes=int(row["data_bytes"]),
            delete_files=int(row["delete_files"]),
        )
    if canary_planning:
        started = time.perf_counter()
        spark.table(name).inputFiles()
        figures["canary_planning_ms"] = round((time.perf_counter() - started) * 1000, 3)
    return figures
