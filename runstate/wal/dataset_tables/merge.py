"""Bring a dataset table up to its dataset's manifest version, on Spark, in one MERGE.

Why a merge is exactly-once even when it is killed, repeated or retried out of order:
- every change carries its WAL seq, and a row is only replaced by a change whose seq is newer, so
  applying a change twice, or an older change after a newer one, changes nothing;
- deleted keys stay as tombstones with their seq, so a late older upsert cannot bring them back;
- the data, the tombstones and the `#version` row commit in one Iceberg snapshot: a merge killed
  before its commit leaves the table as it was, and the next merge starts again from the same version.
A blob that fails its checksum fails the Spark task that reads it, hence the whole MERGE: nothing
is written, and the error names the blob.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from runstate.wal.dataset_tables.naming import VERSION_KEY, table_ident
from runstate.wal.dataset_tables.source import (
    CHANGE_COLUMNS,
    BlobLocation,
    MergePlan,
    blob_reads_frame,
    change_reader,
    plan_merge,
)
from runstate.wal.dataset_tables.table import (
    COPY_ON_WRITE_MAX_BYTES,
    TableFiles,
    ensure_table,
    set_version_property,
    spark_errors,
    table_exists,
    table_files,
    table_properties,
    table_version,
    write_mode_change,
)


@dataclass(frozen=True)
class MergeResult:
    """What one merge did: the table went from `from_version` to `version` reading `blobs` blobs;
    `full` when it read the snapshot and every delta (a rebuild). `files` is what the table holds after
    the merge's commit, or None when the merge wrote nothing."""

    dataset_id: str
    table: str
    from_version: int
    version: int
    blobs: int
    full: bool
    rows_written: int
    seconds: float
    files: TableFiles | None = None

    @property
    def merged(self) -> bool:
        return self.version != self.from_version or self.full


def merge_dataset(
    spark: Any,
    location: BlobLocation,
    dataset_id: str,
    *,
    rebuild: bool = False,
    s3: Any = None,
    copy_on_write_max_bytes: int = COPY_ON_WRITE_MAX_BYTES,
) -> MergeResult:
    """Merge every change after the table's version, up to the manifest's (rebuild: from the snapshot).

    A dataset without a manifest (never flushed, or an unknown id) gets no table. Refused before
    anything is written: a table that belongs to another dataset, a table ahead of the manifest (unless
    rebuilding), which is also what a table whose manifest was lost is. After the commit, the table's
    size sets how the next merge writes (table.write_mode)."""
    started = time.perf_counter()
    manifest = location.blob_store(s3).read_manifest(dataset_id)
    if manifest.etag is None and not table_exists(spark, dataset_id):
        return MergeResult(
            dataset_id, table_ident(dataset_id), 0, 0, 0, False, 0, time.perf_counter() - started
        )
    ident = ensure_table(spark, dataset_id)
    with spark_errors(dataset_id, ident, "merge"):
        properties = table_properties(spark, ident)
        plan = plan_merge(manifest, table_version(properties), rebuild=rebuild)
        if not plan.reads and not plan.full:
            return MergeResult(
                dataset_id,
                ident,
                plan.from_version,
                plan.from_version,
                0,
                False,
                0,
                time.perf_counter() - started,
            )
        files = apply_plan(spark, location, ident, plan)
        mode = write_mode_change(properties, files.bytes, copy_on_write_max_bytes)
        set_version_property(spark, ident, plan.to_version, mode)
    return MergeResult(
        dataset_id,
        ident,
        plan.from_version,
        plan.to_version,
        len(plan.reads),
        plan.full,
        files.records_added,
        time.perf_counter() - started,
        files,
    )


def rebuild_dataset(spark: Any, location: BlobLocation, dataset_id: str, *, s3: Any = None) -> MergeResult:
    """The table rebuilt from the dataset's snapshot plus every delta (keys absent from them are deleted)."""
    return merge_dataset(spark, location, dataset_id, rebuild=True, s3=s3)


def latest_changes(spark: Any, location: BlobLocation, plan: MergePlan) -> Any:
    """One row per key: its last change (highest seq, then position), plus the `#version` row."""
    from pyspark.sql import functions as F

    marker = spark.createDataFrame(
        [(VERSION_KEY, None, plan.to_version, True)],
        "key STRING, value STRING, wal_seq BIGINT, deleted BOOLEAN",
    )
    if not plan.reads:
        return marker
    reads = blob_reads_frame(spark, plan.reads)
    changes = reads.mapInArrow(change_reader(location), CHANGE_COLUMNS)
    last = changes.groupBy("key").agg(F.max(F.struct("wal_seq", "pos", "value", "deleted")).alias("c"))
    return last.select("key", "c.value", "c.wal_seq", "c.deleted").unionByName(marker)


def merge_statement(ident: str, source: str, plan: MergePlan) -> str:
    """The MERGE: newer seqs win; a full read also repairs equal-seq rows and deletes keys it lacks.

    A rebuild makes the table equal to the blobs: every differing row takes the blobs' change whatever
    its seq, and live rows or tombstones the blobs do not know (say a WAL that started over left them
    at higher seqs) become tombstones at the rebuilt version, so the new WAL's changes win over them."""
    newer = "s.wal_seq > t.wal_seq"
    differs = "s.deleted <> t.deleted OR NOT (s.value <=> t.value)"
    if plan.rebuild:
        newer = f"s.wal_seq <> t.wal_seq OR {differs}"
    elif plan.full:
        newer += f" OR (s.wal_seq = t.wal_seq AND ({differs}))"
    statement = (
        f"MERGE INTO {ident} t USING {source} s ON t.key = s.key "
        f"WHEN MATCHED AND ({newer}) THEN UPDATE SET "
        "t.value = s.value, t.wal_seq = s.wal_seq, t.deleted = s.deleted, t.updated_at = current_timestamp() "
        "WHEN NOT MATCHED THEN INSERT (key, value, wal_seq, updated_at, deleted) "
        "VALUES (s.key, s.value, s.wal_seq, current_timestamp(), s.deleted)"
    )
    if plan.full:
        version = int(plan.to_version)
        unknown = (
            f"(NOT t.deleted OR t.wal_seq > {version})"
            if plan.rebuild
            else f"NOT t.deleted AND t.wal_seq <= {version}"
        )
        statement += (
            f" WHEN NOT MATCHED BY SOURCE AND {unknown} THEN UPDATE SET "
            f"t.value = NULL, t.deleted = true, t.wal_seq = {version}, t.updated_at = current_timestamp()"
        )
    return statement


def apply_plan(spark: Any, location: BlobLocation, ident: str, plan: MergePlan) -> TableFiles:
    """Run one planned MERGE (a plan may be stale: its older changes then lose to the stored ones)."""
    view = f"runstate_incoming_{uuid.uuid4().hex}"
    latest_changes(spark, location, plan).createOrReplaceTempView(view)
    try:
        spark.sql(merge_statement(ident, view, plan))
    finally:
        spark.catalog.dropTempView(view)
    return table_files(spark, ident)
