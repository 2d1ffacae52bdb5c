"""Position delete files that apply to no live data file, found and dropped through Iceberg's own scan
planning, in the driver.

rewrite_position_delete_files drops such files ("rewrite-all") by reading them, which Iceberg 1.10 cannot
do on a table with a list or map column (actions.py). Iceberg's remove-dangling-deletes drops only those
older than every data file of their partition: a delete file written in the same commit sequence as the
data files a rewrite produced stays, though every position in it names a file that is gone.
"""

from __future__ import annotations

from typing import Any

POSITION_DELETES = "POSITION_DELETES"


def _java_iter(iterable: Any) -> Any:
    iterator = iterable.iterator()
    try:
        while iterator.hasNext():
            yield iterator.next()
    finally:
        iterator.close()


def unused_position_deletes(jvm: Any, table: Any) -> tuple[Any, list[Any]]:
    """(current snapshot, its live position delete files that no planned scan task carries): a scan
    applies none of them to any row, which is what dropping one must keep true. (None, []) when empty.
    `jvm` is the Spark driver's gateway view (`spark.sparkContext._jvm`), `table` an Iceberg Table."""
    snapshot = table.currentSnapshot()
    if snapshot is None:
        return None, []
    carried = set()
    tasks = table.newScan().useSnapshot(snapshot.snapshotId()).planFiles()
    try:
        for task in _java_iter(tasks):
            carried.update(str(delete.location()) for delete in task.deletes())
    finally:
        tasks.close()
    unused = []
    for manifest in snapshot.deleteManifests(table.io()):
        reader = jvm.org.apache.iceberg.ManifestFiles.readDeleteManifest(manifest, table.io(), table.specs())
        try:
            for delete in _java_iter(reader):
                if str(delete.content().name()) == POSITION_DELETES and str(delete.location()) not in carried:
                    unused.append(delete.copy())  # the reader may reuse its objects
        finally:
            reader.close()
    return snapshot, unused


def drop_unused_position_deletes(jvm: Any, table: Any) -> int:
    """Drop the position delete files no scan applies, in one commit validated from the snapshot they
    were found in (a concurrent commit makes Iceberg check it again, or refuse it). Returns how many."""
    snapshot, unused = unused_position_deletes(jvm, table)
    if not unused:
        return 0
    rewrite = table.newRewrite().validateFromSnapshot(snapshot.snapshotId())
    for delete in unused:
        rewrite = rewrite.deleteFile(delete)
    rewrite.commit()
    return len(unused)
