"""`apply_deletes_sensor`: a dataset table whose merges left delete files gets a maintenance job that
applies them, without waiting for the hourly orchestrator.

A dataset table over the copy-on-write limit (16 MB, runstate.wal.dataset_tables.table) is merged on
read: each MERGE adds a data file and a delete file, and every read pays for them until maintenance
rewrites the data files with their deletes applied (PERFORMANCE.md: about 2x the scan of the same rows
written once after 10 merges of a 20 MB table). The merge run records the table's files in its
materialization (`delete_files`); this sensor reads the materializations after its cursor and hands the
tables at or over `MaintenanceResource.apply_deletes_at` delete files to the core's
`submit_apply_deletes` (runstate.maintenance.deletes), one job of APPLY_DELETES_ACTIONS each. It submits,
never runs: the queue sensor's worker runs (at most W) do the work, and a table with a job pending or
running gets no second one (submit returns the active job). Such a job does not count
against the orchestrator's cadence, so the table's other maintenance still comes on time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import dagster as dg

from runstate.defs.dataset_tables.jobs import TABLES_ASSET
from runstate.defs.maintenance.resources import MaintenanceResource
from runstate.maintenance.deletes import DeletesSubmission, submit_apply_deletes

SENSOR = "apply_deletes_sensor"
# Materializations read per tick; the rest wait for the next tick (the cursor says where).
BATCH = 1000


@dataclass(frozen=True)
class DeletesTick:
    """One tick's outcome: the jobs submitted (or not) and the next cursor."""

    cursor: int
    outcome: DeletesSubmission = field(default_factory=DeletesSubmission)


def tables_over(records: Iterable[dg.EventLogRecord], threshold: int) -> list[str]:
    """The `lake` tables whose latest materialization among `records` shows `threshold` delete files or more."""
    latest: dict[str, int] = {}
    for record in records:
        materialization = record.asset_materialization
        metadata = materialization.metadata if materialization else {}
        table, deletes = metadata.get("table"), metadata.get("delete_files")
        if table is not None and deletes is not None:
            latest[str(table.value)] = int(deletes.value)
    return [ident for ident, count in latest.items() if count >= threshold]


def evaluate_apply_deletes(
    instance: dg.DagsterInstance, cursor: int | None, maintenance: MaintenanceResource
) -> DeletesTick:
    """Read the dataset tables' materializations after `cursor` and submit the jobs they call for.

    Without a cursor (a new sensor) it starts after the newest: older figures may predate maintenance."""
    if cursor is None:
        newest = instance.fetch_materializations(TABLES_ASSET, limit=1)
        return DeletesTick(cursor=newest.records[0].storage_id if newest.records else 0)
    result = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=TABLES_ASSET, after_storage_id=cursor), limit=BATCH, ascending=True
    )
    cursor = result.records[-1].storage_id if result.records else cursor
    over = tables_over(result.records, maintenance.apply_deletes_at)
    if not over:
        return DeletesTick(cursor)
    return DeletesTick(cursor, submit_apply_deletes(maintenance.get_store(), over, added_by=SENSOR))


@dg.sensor(
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Submit a maintenance job that applies a dataset table's delete files once its merges "
    "have left `apply_deletes_at` of them (the worker runs of maintenance_queue_sensor run it).",
)
def apply_deletes_sensor(context: dg.SensorEvaluationContext, maintenance: MaintenanceResource):
    if maintenance.apply_deletes_at <= 0:
        return dg.SkipReason("apply_deletes_at is 0: delete files wait for the orchestrator")
    tick = evaluate_apply_deletes(context.instance, _cursor(context.cursor), maintenance)
    cursor = str(tick.cursor)
    if not tick.outcome.submitted and not tick.outcome.skipped:
        reason = (
            f"no dataset table merged since the last tick has {maintenance.apply_deletes_at} delete files"
        )
        return dg.SensorResult(skip_reason=reason, cursor=cursor)
    context.log.info(tick.outcome.describe())
    return dg.SensorResult(skip_reason=tick.outcome.describe(), cursor=cursor)


def _cursor(raw: str | None) -> int | None:
    """The storage id of the last materialization read; a bad cursor starts again after the newest."""
    return int(raw) if raw and raw.isdigit() else None
