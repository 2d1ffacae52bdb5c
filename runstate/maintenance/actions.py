"""Maintenance actions as Iceberg Spark procedures on the `lake` catalog, with the table's figures
measured around each one.

A dry run writes nothing: orphans use the procedure's own `dry_run`, the other actions report a
plan computed from the metadata tables. A commit that loses a race with a live writer
(CommitFailedException) is retried within the action; rewrite_data_files on a table of several file
groups (partitioned, or over one group's maximum size) also commits its groups as they finish (partial
progress), so a late conflict costs one group, not the whole rewrite. A table of one group commits once
without it: Iceberg's commit service for partial progress costs a small compaction about 0.1 s.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from runstate.maintenance.dangling import drop_unused_position_deletes
from runstate.maintenance.errors import UnknownAction
from runstate.maintenance.figures import iceberg_table, table_figures
from runstate.maintenance.identifiers import ACTIONS, TableRef, validate_identifier
from runstate.maintenance.models import HealthSnapshot
from runstate.maintenance.options import (
    ActionSettings,
    sort_order_sql,
    timestamp_literal,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

CATALOG = "lake"
# Iceberg's binpack defaults: files under 75% of the target are candidates, 5 of them make a group.
BINPACK_MIN_FILE_RATIO = 0.75
BINPACK_MIN_INPUT_FILES = 5
# Retries of an action whose commit lost to a concurrent writer (on top of Iceberg's own commit retries).
COMMIT_RETRIES = 3
PARTIAL_PROGRESS_MAX_COMMITS = 10
# Iceberg's default `max-file-group-size-bytes`: an unpartitioned table over this is several groups.
MAX_FILE_GROUP_BYTES = 100 * 1024**3


@dataclass(frozen=True)
class ActionResult:
    action: str
    success: bool
    message: str = ""
    error: str | None = None
    elapsed_seconds: float = 0.0
    figures: Mapping[str, Any] = field(default_factory=dict)
    before: Mapping[str, Any] = field(default_factory=dict)
    after: Mapping[str, Any] = field(default_factory=dict)
    attempts: int = 1


def _figures_message(figures: Mapping[str, Any], prefix: str = "") -> str:
    text = ", ".join(f"{key}={value}" for key, value in figures.items())
    return f"{prefix}{text}" if text else prefix.rstrip(": ") or "no output"


def _sum_rows(rows: list) -> dict[str, int]:
    """Procedures return one row of counters (sometimes none when there was nothing to do)."""
    totals: dict[str, int] = {}
    for row in rows:
        for key, value in row.asDict().items():
            totals[key] = totals.get(key, 0) + (value or 0)
    return totals


class ActionRunner:
    """Runs one table's actions through `CALL lake.system.<procedure>` or plans them for a dry run."""

    def __init__(
        self,
        spark: SparkSession,
        ref: TableRef,
        settings: ActionSettings | None = None,
        *,
        catalog: str = CATALOG,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.spark = spark
        self.ref = ref
        self.settings = settings or ActionSettings()  # validated when made (ActionPlan, config)
        self.catalog = validate_identifier(catalog, "catalog name")
        self.now = now

    # -- shared helpers -------------------------------------------------------------------------
    def _call(self, procedure: str, *arguments: str) -> list:
        args = ", ".join((f"table => '{self.ref.key}'", *arguments))
        return self.spark.sql(f"CALL {self.catalog}.system.{procedure}({args})").collect()

    def _metadata(self, name: str):
        name = validate_identifier(name, "metadata table")
        return self.spark.table(f"{self.ref.in_catalog(self.catalog)}.{name}")

    def _older_than(self, hours: float) -> str:
        return timestamp_literal(self.now() - timedelta(hours=hours))

    # -- the actions ----------------------------------------------------------------------------
    def rewrite_data_files(self, dry_run: bool) -> tuple[str, dict]:
        s = self.settings
        if dry_run:
            return self._plan_rewrite_data_files()
        arguments = [f"strategy => '{s.rewrite_strategy}'"]
        if s.rewrite_strategy == "sort" and s.sort_order:
            arguments.append(f"sort_order => '{sort_order_sql(s.sort_order)}'")
        options: dict[str, Any] = {"target-file-size-bytes": int(s.target_file_size_bytes)}
        if self._several_file_groups():
            options["partial-progress.enabled"] = "true"
            options["partial-progress.max-commits"] = PARTIAL_PROGRESS_MAX_COMMITS
        if s.delete_file_threshold is not None:
            options["delete-file-threshold"] = int(s.delete_file_threshold)
        pairs = ", ".join(f"'{key}', '{value}'" for key, value in options.items())
        arguments.append(f"options => map({pairs})")
        figures = _sum_rows(self._call("rewrite_data_files", *arguments))
        if figures.get("failed_data_files_count"):
            # Partial progress logs a refused or lost group commit and carries on: make it an error.
            raise RuntimeError(
                f"{figures['failed_data_files_count']} data files were rewritten but their commit failed"
                f" ({_figures_message(figures)})"
            )
        return _figures_message(figures), figures

    def _several_file_groups(self) -> bool:
        """Whether a rewrite may form more than one file group (read in the driver, no Spark job)."""
        table = iceberg_table(self.spark, self.ref.in_catalog(self.catalog))
        if not table.spec().isUnpartitioned():
            return True
        snapshot = table.currentSnapshot()
        size = snapshot.summary().get("total-files-size") if snapshot is not None else None
        return size is None or int(size) > MAX_FILE_GROUP_BYTES

    def _plan_rewrite_data_files(self) -> tuple[str, dict]:
        from pyspark.sql import functions as F

        s = self.settings
        threshold = int(s.target_file_size_bytes * BINPACK_MIN_FILE_RATIO)
        files = self._metadata("data_files")
        if s.rewrite_strategy == "binpack":
            files = files.where(F.col("file_size_in_bytes") < F.lit(threshold))
        row = files.agg(
            F.count(F.lit(1)).alias("n"), F.coalesce(F.sum("file_size_in_bytes"), F.lit(0)).alias("b")
        ).first()
        count, size = int(row["n"]), int(row["b"])
        if s.rewrite_strategy == "binpack" and count < BINPACK_MIN_INPUT_FILES:
            count, size = 0, 0
        planned = max(1, math.ceil(size / s.target_file_size_bytes)) if count else 0
        figures = {
            "would_rewrite_data_files_count": count,
            "would_rewrite_bytes_count": size,
            "would_add_data_files_count": planned,
        }
        return _figures_message(figures, "dry run: "), figures

    def rewrite_position_delete_files(self, dry_run: bool) -> tuple[str, dict]:
        if dry_run:
            from pyspark.sql import functions as F

            row = (
                self._metadata("delete_files")
                .where(F.col("content") == F.lit(1))
                .agg(
                    F.count(F.lit(1)).alias("n"), F.coalesce(F.sum("file_size_in_bytes"), F.lit(0)).alias("b")
                )
                .first()
            )
            figures = {
                "would_rewrite_delete_files_count": int(row["n"]),
                "would_rewrite_bytes_count": int(row["b"]),
            }
            return _figures_message(figures, "dry run: "), figures
        if self._has_list_or_map_column():
            return self._apply_position_deletes()
        # After a rewrite that applied deletes, the old delete files point at files that are gone; Iceberg
        # keeps them (their sequence numbers still cover the new file) unless every one is rewritten.
        arguments = ["options => map('rewrite-all', 'true')"] if self.settings.delete_file_threshold else []
        figures = _sum_rows(self._call("rewrite_position_delete_files", *arguments))
        return _figures_message(figures), figures

    def _has_list_or_map_column(self) -> bool:
        """Iceberg 1.10's position-delete reader fails on a table with a list or map column at any depth
        ("Invalid partition field parent: list<...>", Iceberg issue 15080): it reads the deleted row's
        struct, the whole table schema, as if each primitive in it could be a partition source."""
        from pyspark.sql.types import ArrayType, MapType, StructType

        pending = [self.spark.table(self.ref.in_catalog(self.catalog)).schema]  # analysis only, no job
        while pending:
            kind = pending.pop()
            if isinstance(kind, ArrayType | MapType):
                return True
            if isinstance(kind, StructType):
                pending.extend(f.dataType for f in kind.fields)
        return False

    def _apply_position_deletes(self) -> tuple[str, dict]:
        """Where the delete files cannot be read, apply them instead: rewrite every data file that has one,
        under the new snapshot's sequence number (above every delete's), so every delete file is left
        dangling and dropped, with the rewrite or after it. No delete file is left to compact."""
        options = {
            "delete-file-threshold": "1",
            "use-starting-sequence-number": "false",
            "remove-dangling-deletes": "true",
            "target-file-size-bytes": str(int(self.settings.target_file_size_bytes)),
        }
        pairs = ", ".join(f"'{key}', '{value}'" for key, value in options.items())
        figures = _sum_rows(self._call("rewrite_data_files", f"options => map({pairs})"))
        if figures.get("failed_data_files_count"):
            raise RuntimeError(f"applying the position deletes failed ({_figures_message(figures)})")
        # What is left applies to no file: delete files of the same sequence as a rewrite before this one.
        table = iceberg_table(self.spark, self.ref.in_catalog(self.catalog))
        figures["dropped_delete_files_count"] = drop_unused_position_deletes(
            self.spark.sparkContext._jvm, table
        )
        return _figures_message(figures, "applied as a data-file rewrite (a list or map column): "), figures

    def rewrite_manifests(self, dry_run: bool) -> tuple[str, dict]:
        if dry_run:
            figures = {"would_rewrite_manifests_count": self._metadata("manifests").count()}
            return _figures_message(figures, "dry run: "), figures
        figures = _sum_rows(self._call("rewrite_manifests"))
        return _figures_message(figures), figures

    def expire_snapshots(self, dry_run: bool) -> tuple[str, dict]:
        s = self.settings
        if dry_run:
            return self._plan_expire_snapshots()
        figures = _sum_rows(
            self._call(
                "expire_snapshots",
                f"older_than => {self._older_than(s.expire_older_than_hours)}",
                f"retain_last => {int(s.retain_last)}",
            )
        )
        return _figures_message(figures), figures

    def _plan_expire_snapshots(self) -> tuple[str, dict]:
        # Iceberg keeps the current snapshot, the newest `retain_last`, and all newer than the cutoff.
        s = self.settings
        cutoff = self.now() - timedelta(hours=s.expire_older_than_hours)
        cutoff = cutoff.astimezone(UTC).replace(tzinfo=None)
        snapshots = self._metadata("snapshots").select("committed_at")
        rows = snapshots.orderBy("committed_at", ascending=False).collect()
        expirable = [r for i, r in enumerate(rows) if i >= s.retain_last and r["committed_at"] < cutoff]
        figures = {"would_expire_snapshots_count": len(expirable), "snapshot_count": len(rows)}
        return _figures_message(figures, "dry run: "), figures

    def remove_orphan_files(self, dry_run: bool) -> tuple[str, dict]:
        rows = self._call(
            "remove_orphan_files",
            f"older_than => {self._older_than(self.settings.orphan_older_than_hours)}",
            f"dry_run => {'true' if dry_run else 'false'}",
        )
        key = "would_remove_orphan_files_count" if dry_run else "removed_orphan_files_count"
        figures = {key: len(rows)}
        return _figures_message(figures, "dry run: " if dry_run else ""), figures

    def run(
        self, action: str, dry_run: bool = False, before: Mapping[str, Any] | None = None
    ) -> ActionResult:
        """One action, retried when its commit loses to a concurrent writer; a Spark failure becomes an
        unsuccessful result that names the table. `before` (the table's figures) enables `after`."""
        if action not in ACTIONS:
            raise UnknownAction(f"unknown maintenance action {action!r}; choose from {', '.join(ACTIONS)}")
        started = time.perf_counter()
        for attempt in range(1, COMMIT_RETRIES + 2):
            try:
                message, figures = getattr(self, action)(dry_run)
                break
            except Exception as exc:  # noqa: BLE001 - recorded in job_actions, the job then fails
                if _lost_commit_race(exc) and attempt <= COMMIT_RETRIES:
                    log.info(
                        "%s on %s lost a commit race (attempt %d); retrying", action, self.ref.key, attempt
                    )
                    continue
                error = f"{action} on {self.ref.key} failed: {type(exc).__name__}: {_describe(exc)}"
                log.warning("%s", error)
                return ActionResult(action, False, "", error, time.perf_counter() - started, attempts=attempt)
        elapsed = time.perf_counter() - started
        after = self.figures() if before is not None and not dry_run else {}
        return ActionResult(action, True, message, None, elapsed, figures, dict(before or {}), after, attempt)

    def refresh_table(self) -> None:
        """Bring a cached copy of the table up to its current commit: one catalog query, and a metadata
        read only when the table changed. A table that cannot be loaded is left for the action to report."""
        try:
            iceberg_table(self.spark, self.ref.in_catalog(self.catalog)).refresh()
        except Exception:  # noqa: BLE001 - the action names the table and the cause
            log.debug("could not refresh %s before its job", self.ref.key, exc_info=True)

    def figures(self, known: HealthSnapshot | None = None) -> dict[str, Any]:
        return table_figures(
            self.spark, self.ref, self.catalog, known=known, canary_planning=self.settings.canary_planning
        )


def _describe(exc: BaseException) -> str:
    """The first line of a (Java) error plus its root cause, which holds the reason (a refused commit)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    causes = [line for line in lines if line.startswith("Caused by:")]
    text = (
        lines[0]
        if not causes or causes[-1] == lines[0]
        else f"{lines[0]} (root cause: {causes[-1][10:].strip()})"
    )
    return text[:1000]


def _lost_commit_race(exc: BaseException) -> bool:
    """Iceberg's CommitFailedException (a concurrent commit won) reaches Python only as text."""
    return "CommitFailedException" in str(exc) or "CommitFailedException" in type(exc).__name__
