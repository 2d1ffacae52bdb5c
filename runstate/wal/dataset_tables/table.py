"""A dataset table's DDL, the version it reached, and one place that turns Spark failures into DatasetTableErrors."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from runstate.spark import create_namespace
from runstate.wal.dataset_tables import naming
from runstate.wal.dataset_tables.errors import DatasetTableError
from runstate.wal.dataset_tables.naming import DATASET_PROPERTY, VERSION_PROPERTY, table_ident
from runstate.wal.errors import BlobIntegrityError

COLUMNS = (
    "key STRING NOT NULL, value STRING, wal_seq BIGINT NOT NULL, updated_at TIMESTAMP NOT NULL, "
    "deleted BOOLEAN NOT NULL"
)
# How a MERGE writes, chosen by the table's size (write_mode). Copy-on-write rewrites the data files a
# merge touches: for a small table that is about the cost of the merge itself, and the table stays as
# fast to read as the same rows written once. Merge-on-read writes a data file and a delete file per
# merge instead, which every read pays for until maintenance applies them (apply_deletes_sensor): the
# cheaper write once rewriting the touched files costs more than the merge (PERFORMANCE.md).
COPY_ON_WRITE = "copy-on-write"
MERGE_ON_READ = "merge-on-read"
WRITE_MODE_PROPERTIES = ("write.merge.mode", "write.update.mode", "write.delete.mode")
COPY_ON_WRITE_MAX_BYTES = 16 << 20
TABLE_PROPERTIES = {
    "format-version": "2",
    **dict.fromkeys(WRITE_MODE_PROPERTIES, COPY_ON_WRITE),  # a new table is empty: small
    naming.MAINTENANCE_ENABLED_PROPERTY: "true",
}
BLOB_ERROR = re.compile(r"BlobIntegrityError: (.+)")
PYTHON_ERROR = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")


def _properties_sql(properties: dict[str, str]) -> str:
    # Keys and values are our constants and validated dataset ids ([A-Za-z0-9_.-]): nothing to escape.
    return ", ".join(f"'{key}'='{value}'" for key, value in properties.items())


def ensure_table(spark: Any, dataset_id: str) -> str:
    """Create `lake.datasets.<name>` (and the namespace) unless it exists; returns its identifier.

    The CREATE records the dataset id in the table's properties, atomically with the table itself: of
    two ids whose names collide, the first to create the table owns it, and the other is refused here
    before it writes anything (the catalog commits one creation, so a race has one winner too)."""
    ident = table_ident(dataset_id)
    properties = {**TABLE_PROPERTIES, DATASET_PROPERTY: dataset_id, VERSION_PROPERTY: "0"}
    with spark_errors(dataset_id, ident, "create"):
        create_namespace(spark, naming.NAMESPACE)
        try:
            spark.sql(
                f"CREATE TABLE IF NOT EXISTS {ident} ({COLUMNS}) USING iceberg "
                f"TBLPROPERTIES ({_properties_sql(properties)})"
            )
        except Exception as error:
            # Two runs creating the same table at once: the loser's IF NOT EXISTS check came too early.
            if "already exists" not in str(error).lower():
                raise
    check_owner(spark, dataset_id, ident)
    return ident


def check_owner(spark: Any, dataset_id: str, ident: str) -> None:
    """DatasetTableError unless the table records `dataset_id` as the dataset it belongs to."""
    with spark_errors(dataset_id, ident, "look up"):
        owner = table_properties(spark, ident).get(DATASET_PROPERTY)
    if owner == dataset_id:
        return
    whose = f"belongs to dataset {owner!r}" if owner else f"has no {DATASET_PROPERTY} property"
    raise DatasetTableError(
        f"dataset {dataset_id!r}: table {ident} {whose}, so it is not this dataset's table; "
        "nothing was written (drop or rename that table if it is not a dataset table)"
    )


def table_exists(spark: Any, dataset_id: str) -> bool:
    with spark_errors(dataset_id, table_ident(dataset_id), "look up"):
        return bool(spark.catalog.tableExists(table_ident(dataset_id)))


def marker_version(spark: Any, ident: str, snapshot_id: int | None = None) -> int:
    """The WAL version the table (or one of its snapshots) reached: its `#version` row, 0 if none."""
    travel = f" VERSION AS OF {int(snapshot_id)}" if snapshot_id is not None else ""
    row = spark.sql(
        f"SELECT max(wal_seq) AS v FROM {ident}{travel} WHERE key = '{naming.VERSION_KEY}'"
    ).first()
    return int(row.v or 0)


def table_version(properties: dict[str, str]) -> int:
    """Where a merge starts: the version property, read from metadata without a scan. It is set after
    the commit that reached it, so it is never ahead of the `#version` row; when it lags (a merge killed
    between the two), the next merge re-applies a few changes, which the newer-seq rule makes harmless."""
    value = properties.get(VERSION_PROPERTY, "0")
    return int(value) if value.isdigit() else 0


@dataclass(frozen=True)
class TableFiles:
    """A table's data and delete files, and all their bytes, after a commit: each merge-on-read MERGE adds
    a data file and a delete file, which every read pays for until maintenance applies the deletes."""

    data_files: int
    delete_files: int
    records_added: int
    bytes: int = 0

    @classmethod
    def from_summary(cls, summary: dict[str, str] | None) -> TableFiles:
        """From a snapshot's summary, whose totals Iceberg keeps exact on every commit."""
        summary = summary or {}
        return cls(
            data_files=int(summary.get("total-data-files", 0)),
            delete_files=int(summary.get("total-delete-files", 0)),
            records_added=int(summary.get("added-records", 0)),
            bytes=int(summary.get("total-files-size", 0)),
        )


def table_files(spark: Any, ident: str) -> TableFiles:
    """The table's files after its newest commit, from that snapshot's summary (no scan)."""
    row = spark.sql(f"SELECT summary FROM {ident}.snapshots ORDER BY committed_at DESC LIMIT 1").first()
    return TableFiles.from_summary(row.summary if row else None)


def write_mode(current: str | None, table_bytes: int, max_bytes: int = COPY_ON_WRITE_MAX_BYTES) -> str:
    """Copy-on-write up to `max_bytes` of files, merge-on-read above; back to copy-on-write only under
    half of it (after maintenance, say), so a table near the limit does not switch at every merge."""
    if current == MERGE_ON_READ:
        return COPY_ON_WRITE if table_bytes <= max_bytes // 2 else MERGE_ON_READ
    return MERGE_ON_READ if table_bytes > max_bytes else COPY_ON_WRITE


def write_mode_change(properties: dict[str, str], table_bytes: int, max_bytes: int) -> str | None:
    """The write mode the table's next merge should use, if it differs from the one its properties set."""
    current = properties.get(WRITE_MODE_PROPERTIES[0])
    mode = write_mode(current, table_bytes, max_bytes)
    return mode if mode != current else None


def set_version_property(spark: Any, ident: str, version: int, mode: str | None = None) -> None:
    """Record the version as a table property too, for catalogs and people (the `#version` row is the
    one a merge trusts: it commits with the data), and the write mode of the next merge if it changes."""
    properties = {VERSION_PROPERTY: str(int(version))}
    if mode is not None:
        properties.update(dict.fromkeys(WRITE_MODE_PROPERTIES, mode))
    spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ({_properties_sql(properties)})")


def table_properties(spark: Any, ident: str) -> dict[str, str]:
    return {row.key: row.value for row in spark.sql(f"SHOW TBLPROPERTIES {ident}").collect()}


@contextmanager
def spark_errors(dataset_id: str, ident: str, action: str) -> Iterator[None]:
    """A blob that failed in a Spark task becomes the WAL's BlobIntegrityError (its message names the
    blob); any other Spark or JVM failure becomes one DatasetTableError line naming the dataset and table."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    try:
        yield
    except (PySparkException, Py4JError) as error:
        text = str(error)
        blob = BLOB_ERROR.search(text)
        if blob:
            raise BlobIntegrityError(blob.group(1).strip()) from None
        cause = _cause(text, error)
        raise DatasetTableError(f"dataset {dataset_id!r}: {action} of {ident} failed: {cause}") from None


def _cause(text: str, error: BaseException) -> str:
    """The line that says what went wrong: a Python task's own exception, else Spark's first line."""
    head = text.split("JVM stacktrace:")[0]
    lines = [line.strip() for line in head.splitlines() if line.strip()]
    raised = [line for line in lines if PYTHON_ERROR.match(line)]
    return (raised[-1] if raised else lines[0] if lines else type(error).__name__)[:500]
