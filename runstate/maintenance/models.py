"""Value types of the maintenance domain: jobs, claims, action records, cache entries, health, audit.

A claim carries the job's `TableRef` and `ActionPlan` themselves. The rows read back or written as
they are (jobs, cache entries, health) carry `database` and `table`, the columns' names, and expose
the `TableRef` as `ref`, so no caller rebuilds `"db.table"` strings by hand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from runstate.maintenance.identifiers import TableRef
from runstate.maintenance.plan import ActionPlan

JOB_STATUSES = ("pending", "running", "completed", "failed", "cancelled")
ACTIVE_STATUSES = ("pending", "running")
COMPLETION_STATUSES = ("completed", "failed", "cancelled")
# The one default lease of a claim, 15 minutes: the core's `claim`, `Claim` and the deployment's
# `MaintenanceConfig` all take it. A worker beats every third of its lease from a thread, and once more
# before each action, but a beat can still miss (a database blip, a host so loaded that the thread is
# not scheduled, a JVM paused in a long Spark procedure's GC); a lease that outlasts several missed beats
# keeps a slow but live worker from being fenced out mid-procedure and its job run twice. A dead worker
# run does not wait for it: `maintenance_queue_sensor` ends the leases of dead runs at once.
DEFAULT_LEASE_SECONDS = 900.0
# Claims of one job before it fails for good (a claim whose lease ran out counts as one).
DEFAULT_MAX_ATTEMPTS = 3


class _OnTable:
    """Mixin for values that name one table through `database` and `table` fields."""

    database: str
    table: str

    @property
    def ref(self) -> TableRef:
        return TableRef(self.database, self.table)

    @property
    def table_key(self) -> str:
        return self.ref.key


@dataclass(frozen=True)
class Claim:
    """One fenced claim of a job: every write made with it matches `attempt_id`. `plan` is the job's as
    submit stored it (validated then), so the worker runs it as it is."""

    job_id: str
    attempt_id: str
    ref: TableRef
    plan: ActionPlan
    attempt_count: int = 0
    worker: str = ""
    lease_seconds: float = DEFAULT_LEASE_SECONDS


@dataclass(frozen=True)
class Job(_OnTable):
    job_id: str
    database: str
    table: str
    actions: tuple[str, ...]
    dry_run: bool
    status: str
    submitted_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    error: str | None
    attempt_id: str | None
    deleted_at: datetime | None
    options: Mapping[str, Any] = field(hash=False)
    attempt_count: int | None = None
    claimed_by: str | None = None
    visible_at: datetime | None = None

    @property
    def cancel_requested(self) -> bool:
        """Cancelled while running: the worker has not stopped yet."""
        return self.status == "cancelled" and self.completed_at is None

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_STATUSES


@dataclass(frozen=True)
class ActionRecord:
    id: int
    job_id: str
    action: str
    success: bool
    message: str
    error: str | None
    elapsed_seconds: float
    created_at: datetime
    # Table figures measured before and after the action (files, bytes, delete files, manifests,
    # canary planning time); empty for dry runs and for rows written before they were recorded.
    before: Mapping[str, Any] = field(default_factory=dict, hash=False)
    after: Mapping[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class CachedTable(_OnTable):
    """One row of table_cache_entries: a catalog table and its opt-in flag (None = unset)."""

    database: str
    table: str
    maintenance_enabled: bool | None = None
    payload: Mapping[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class HealthSnapshot(_OnTable):
    """One row of health_snapshots; field names are the column names (database/table shortened).

    HealthAnalyzer.analyze() builds it (id None until stored); latest_health() reads it back.
    """

    database: str
    table: str
    needs_maintenance: bool
    total_data_files: int = 0
    total_delete_files: int = 0
    total_size_bytes: int = 0
    avg_file_size_bytes: float = 0.0
    small_file_count: int = 0
    small_file_pct: float = 0.0
    snapshot_count: int = 0
    manifest_count: int = 0
    maintenance_enabled: bool | None = None
    maintenance_cadence_hours: int | None = None
    recommended_actions: Sequence[str] = field(default=(), hash=False)  # the analyzer's is a list
    error: str | None = None
    total_records: int = 0
    snapshot_id: int = 0
    health_status: str = "Unknown"
    hours_since_last_snapshot: float = 0.0
    oldest_snapshot_age_hours: float = 0.0
    checked_at: datetime | None = None
    id: int | None = None

    @property
    def delete_ratio(self) -> float:
        """Delete files per data file: how much merge-on-read work every scan pays."""
        return self.total_delete_files / self.total_data_files if self.total_data_files else 0.0


@dataclass(frozen=True)
class OrchestratorRun:
    started_at: datetime
    completed_at: datetime
    status: str
    tables_assessed: int = 0
    tables_skipped: int = 0
    tables_healthy: int = 0
    jobs_submitted: int = 0
    jobs_completed: int = 0
    jobs_failed: int = 0
    dry_run: bool = False
    error: str | None = None
    id: int | None = None
    created_at: datetime | None = None


__all__ = [
    "ACTIVE_STATUSES",
    "COMPLETION_STATUSES",
    "DEFAULT_LEASE_SECONDS",
    "DEFAULT_MAX_ATTEMPTS",
    "JOB_STATUSES",
    "ActionPlan",
    "ActionRecord",
    "CachedTable",
    "Claim",
    "HealthSnapshot",
    "Job",
    "OrchestratorRun",
    "TableRef",
]
