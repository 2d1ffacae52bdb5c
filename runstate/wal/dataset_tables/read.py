"""Reading a dataset table: the live rows now, or as they were at a version a merge reached.

The live rows are `SELECT key, value FROM lake.datasets.<name> WHERE NOT deleted` (keys and values
are canonical JSON text). An earlier version is an Iceberg snapshot: every merge commits its
`#version` row with its data, so the snapshot that holds version N is found by reading that row
along the table's history (a binary search: versions only grow along it).
"""

from __future__ import annotations

import json
from typing import Any

from runstate.wal.changes import Key
from runstate.wal.dataset_tables.errors import DatasetTableError, VersionNotFound
from runstate.wal.dataset_tables.naming import table_ident
from runstate.wal.dataset_tables.table import check_owner, marker_version, spark_errors, table_exists


def live_rows_sql(ident: str, snapshot_id: int | None = None) -> str:
    travel = f" VERSION AS OF {int(snapshot_id)}" if snapshot_id is not None else ""
    return f"SELECT key, value FROM {ident}{travel} WHERE NOT deleted"


def read_table(spark: Any, dataset_id: str, version: int | None = None) -> tuple[int, dict[Key, Any]]:
    """(version, state): the same pair the blob reader gives, read from the table (or its snapshot)."""
    ident = table_ident(dataset_id)
    if not table_exists(spark, dataset_id):
        raise DatasetTableError(
            f"dataset {dataset_id!r}: table {ident} does not exist; run `runstate wal merge` first"
        )
    check_owner(spark, dataset_id, ident)
    with spark_errors(dataset_id, ident, "read"):
        snapshot_id = None
        if version is None:
            version = marker_version(spark, ident)
        else:
            snapshot_id = snapshot_at_version(spark, dataset_id, ident, version)
        # The CLI prints the state: it is meant to pass through this process (the merge never does).
        rows = spark.sql(live_rows_sql(ident, snapshot_id)).collect()
    return version, {json.loads(row.key): json.loads(row.value) for row in rows}


def snapshot_at_version(spark: Any, dataset_id: str, ident: str, version: int) -> int:
    """The id of the snapshot whose `#version` row is `version`, or VersionNotFound naming its neighbours."""
    history = [
        row.snapshot_id
        for row in spark.sql(
            f"SELECT snapshot_id FROM {ident}.history WHERE is_current_ancestor ORDER BY made_current_at"
        ).collect()
    ]
    low, high = 0, len(history) - 1
    below = above = None
    while low <= high:
        middle = (low + high) // 2
        reached = marker_version(spark, ident, history[middle])
        if reached == version:
            # Any snapshot at this version will do: later ones at the same version (compactions) hold
            # the same rows.
            return history[middle]
        if reached < version:
            below, low = reached, middle + 1
        else:
            above, high = reached, middle - 1
    raise VersionNotFound(
        f"dataset {dataset_id!r}: no snapshot of {ident} is at version {version} (nearest merged versions: "
        f"{'none' if below is None else below} below, {'none' if above is None else above} above); "
        "time travel reaches the versions merges reached, while their snapshots are kept"
    )
