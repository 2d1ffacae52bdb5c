"""The table-health analyzer: metrics from Iceberg metadata tables, and a verdict from thresholds.

File metrics come from one aggregate over `.files` pinned to the current snapshot, the manifest count
from that snapshot's manifest list, snapshot ages from `.snapshots` (`all_delete_files` counts
history, so it is no health metric). A metadata query that fails is recorded in `error` and
the rest of the report is still filled; only a missing table is fatal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from runstate.maintenance.catalog import (
    CADENCE_PROPERTY,
    CATALOG,
    ENABLED_PROPERTY,
    parse_cadence_hours,
    parse_enabled,
)
from runstate.maintenance.errors import TableNotFound
from runstate.maintenance.figures import current_snapshot
from runstate.maintenance.identifiers import ACTIONS, TableRef, validate_identifier
from runstate.maintenance.models import HealthSnapshot

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
NEEDS_MAINTENANCE = "NeedsMaintenance"
UNKNOWN = "Unknown"
MB = 1024 * 1024


@dataclass(frozen=True)
class HealthThresholds:
    """When a metric asks for an action. Defaults follow the Snowpack anchors."""

    small_file_bytes: int = 16 * MB
    # Iceberg's binpack needs 5 candidate files (min-input-files) before it rewrites anything, so
    # fewer small files are not worth a job (a compacted small table is one small file).
    min_small_files: int = 5
    max_snapshots: int = 100
    max_snapshot_age_hours: float = 7 * 24
    max_delete_files: int = 0
    max_manifests: int = 100


def recommend(health: HealthSnapshot, thresholds: HealthThresholds) -> list[str]:
    """Ordered actions (in ACTIONS order) that the metrics ask for."""
    wanted = set()
    if health.small_file_count >= max(thresholds.min_small_files, 1):
        wanted.add("rewrite_data_files")
    if health.total_delete_files > thresholds.max_delete_files:
        # Applied, not just combined: rewrite_position_delete_files alone changed nothing on a table with
        # 2 delete files. rewrite_data_files with a delete-file threshold rewrites the data files they
        # point at, then rewriting every delete file drops the positions left dangling (Orchestrator._plan).
        wanted.update(("rewrite_data_files", "rewrite_position_delete_files"))
    if health.manifest_count > thresholds.max_manifests:
        wanted.add("rewrite_manifests")
    if (
        health.snapshot_count > thresholds.max_snapshots
        or health.oldest_snapshot_age_hours > thresholds.max_snapshot_age_hours
    ):
        wanted.add("expire_snapshots")
    return [action for action in ACTIONS if action in wanted]


def apply_verdict(
    health: HealthSnapshot, thresholds: HealthThresholds, metrics_complete: bool
) -> HealthSnapshot:
    """The report with recommended_actions, needs_maintenance and health_status set from its metrics."""
    actions = recommend(health, thresholds)
    if actions:
        status = NEEDS_MAINTENANCE
    else:
        # A partial report that found nothing wrong is not evidence of health.
        status = HEALTHY if metrics_complete else UNKNOWN
    return replace(health, recommended_actions=actions, needs_maintenance=bool(actions), health_status=status)


class HealthAnalyzer:
    """Computes the HealthSnapshot of tables of the `lake` catalog through one Spark session."""

    def __init__(
        self,
        spark: SparkSession | Callable[[], SparkSession],
        thresholds: HealthThresholds | None = None,
        *,
        catalog: str = CATALOG,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._spark = spark
        self.thresholds = thresholds or HealthThresholds()
        self.catalog = validate_identifier(catalog, "catalog name")
        self.now = now

    @property
    def spark(self) -> SparkSession:
        """The session. A factory passed in (a resource's `get_session`) is called on the first analysis,
        so an orchestrator pass that skips every table never starts Spark."""
        if not hasattr(self._spark, "sql"):
            self._spark = self._spark()
        return self._spark

    def _metadata(self, ref: TableRef, name: str):
        return self.spark.table(f"{ref.in_catalog(self.catalog)}.{name}")

    def properties(self, ref: TableRef) -> dict[str, str]:
        try:
            rows = self.spark.sql(f"SHOW TBLPROPERTIES {ref.in_catalog(self.catalog)}").collect()
        except Exception as exc:  # noqa: BLE001 - translated to the one fatal case
            if "not found" in str(exc).lower() or "TABLE_OR_VIEW_NOT_FOUND" in str(exc):
                raise TableNotFound(f"table {self.catalog}.{ref.key} not found") from exc
            raise
        return {row["key"]: row["value"] for row in rows}

    def analyze(self, ref: TableRef) -> HealthSnapshot:
        checked_at = self.now()
        properties = self.properties(ref)
        metrics: dict[str, Any] = {}
        errors: list[str] = []
        snapshot_id = 0
        try:
            # The snapshot every file metric below is pinned to, so the row is of one snapshot (and
            # a maintenance job may reuse it as its exact "before" figures while the table is unchanged).
            current, metrics["manifest_count"] = current_snapshot(self.spark, ref.in_catalog(self.catalog))
            snapshot_id = current or 0
        except Exception as exc:  # noqa: BLE001 - non-fatal: recorded, the other metrics still count
            errors.append(f"manifests: {_first_line(exc)}")
        for step in (self._files, self._snapshots):
            try:
                metrics.update(step(ref, snapshot_id, checked_at))
            except Exception as exc:  # noqa: BLE001 - non-fatal: recorded, the other metrics still count
                errors.append(f"{step.__name__.strip('_')}: {_first_line(exc)}")
                log.warning("health of %s: %s failed: %s", ref.key, step.__name__, _first_line(exc))
        health = HealthSnapshot(
            ref.database,
            ref.table,
            needs_maintenance=False,
            checked_at=checked_at,
            snapshot_id=snapshot_id,
            maintenance_enabled=parse_enabled(properties.get(ENABLED_PROPERTY)),
            maintenance_cadence_hours=parse_cadence_hours(properties.get(CADENCE_PROPERTY)),
            error="; ".join(errors) or None,
            **metrics,
        )
        return apply_verdict(health, self.thresholds, metrics_complete=not errors)

    # Each step returns the columns it measures; a step that raises leaves its columns at their defaults.

    def _files(self, ref: TableRef, snapshot_id: int, *_: Any) -> dict[str, Any]:
        """Data files, bytes, records and small files, and delete files: one aggregate over `.files`."""
        if not snapshot_id:
            return {}
        small = int(self.thresholds.small_file_bytes)
        row = self.spark.sql(
            "SELECT count_if(content = 0) AS files,"
            " coalesce(sum(if(content = 0, file_size_in_bytes, 0)), 0) AS bytes,"
            " coalesce(sum(if(content = 0, record_count, 0)), 0) AS records,"
            f" count_if(content = 0 AND file_size_in_bytes < {small}) AS small,"
            " count_if(content <> 0) AS deletes"
            f" FROM {ref.in_catalog(self.catalog)}.files VERSION AS OF {int(snapshot_id)}"
        ).first()
        files, size, small_files = int(row["files"]), int(row["bytes"]), int(row["small"])
        metrics = {
            "total_data_files": files,
            "total_size_bytes": size,
            "total_records": int(row["records"]),
            "small_file_count": small_files,
            "total_delete_files": int(row["deletes"]),
        }
        if files:
            metrics.update(avg_file_size_bytes=size / files, small_file_pct=100.0 * small_files / files)
        return metrics

    def _snapshots(self, ref: TableRef, snapshot_id: int, checked_at: datetime) -> dict[str, Any]:
        # committed_at comes back in the session time zone; unix_timestamp keeps the arithmetic zone-free.
        from pyspark.sql import functions as F

        rows = (
            self._metadata(ref, "snapshots")
            .select("snapshot_id", F.unix_timestamp("committed_at").alias("epoch"))
            .collect()
        )
        if not rows:
            return {"snapshot_count": 0}
        now_epoch = checked_at.timestamp()
        by_id = {row["snapshot_id"]: row["epoch"] for row in rows}
        newest = max(row["epoch"] for row in rows)
        current_epoch = by_id.get(snapshot_id, newest)
        return {
            "snapshot_count": len(rows),
            "hours_since_last_snapshot": max(0.0, (now_epoch - current_epoch) / 3600),
            "oldest_snapshot_age_hours": max(0.0, (now_epoch - min(by_id.values())) / 3600),
        }


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
