"""The maintenance service's one frozen configuration, parsed once from the Settings (or from the Dagster
resource's fields, whose descriptions say what each value does). The defaults of the health thresholds,
the action settings and the orchestrator are those value types' own."""

from __future__ import annotations

from dataclasses import dataclass

from runstate.config import Settings
from runstate.maintenance.health import MB, HealthThresholds
from runstate.maintenance.models import DEFAULT_LEASE_SECONDS, DEFAULT_MAX_ATTEMPTS
from runstate.maintenance.options import ActionSettings
from runstate.maintenance.orchestrator import OrchestratorSettings


@dataclass(frozen=True)
class MaintenanceConfig:
    dsn: str = Settings.pg_url
    pg_schema: str = Settings.schema
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    lease_seconds: float = DEFAULT_LEASE_SECONDS  # written once, in models.py (why 15 minutes: there)
    lock_ttl_seconds: float | None = None  # None: the lease
    max_worker_runs: int = Settings.maintenance_workers
    worker_budget_seconds: float = 1800.0
    worker_name: str = "dagster"
    # Health thresholds.
    small_file_mb: float = HealthThresholds.small_file_bytes / MB
    min_small_files: int = HealthThresholds.min_small_files
    max_snapshots: int = HealthThresholds.max_snapshots
    max_snapshot_age_hours: float = float(HealthThresholds.max_snapshot_age_hours)
    max_delete_files: int = HealthThresholds.max_delete_files
    max_manifests: int = HealthThresholds.max_manifests
    apply_deletes_at: int = Settings.apply_deletes_at
    # Action defaults (a job's options override them).
    target_file_size_bytes: int = ActionSettings.target_file_size_bytes
    expire_older_than_hours: float = ActionSettings.expire_older_than_hours
    retain_last: int = ActionSettings.retain_last
    orphan_older_than_hours: float = ActionSettings.orphan_older_than_hours
    # Orchestrator and retention.
    orchestrator_dry_run: bool = OrchestratorSettings.dry_run
    default_cadence_hours: int = OrchestratorSettings.default_cadence_hours
    health_keep_days: float = 30.0

    @classmethod
    def from_settings(cls, s: Settings) -> MaintenanceConfig:
        return cls(
            dsn=s.pg_url,
            pg_schema=s.schema,
            max_worker_runs=s.maintenance_workers,
            apply_deletes_at=s.apply_deletes_at,
        )

    def thresholds(self) -> HealthThresholds:
        return HealthThresholds(
            small_file_bytes=int(self.small_file_mb * MB),
            min_small_files=self.min_small_files,
            max_snapshots=self.max_snapshots,
            max_snapshot_age_hours=self.max_snapshot_age_hours,
            max_delete_files=self.max_delete_files,
            max_manifests=self.max_manifests,
        )

    def action_settings(self) -> ActionSettings:
        return ActionSettings(
            target_file_size_bytes=self.target_file_size_bytes,
            expire_older_than_hours=self.expire_older_than_hours,
            retain_last=self.retain_last,
            orphan_older_than_hours=self.orphan_older_than_hours,
        ).validated()

    def orchestrator_settings(self, dry_run: bool | None = None) -> OrchestratorSettings:
        return OrchestratorSettings(
            dry_run=self.orchestrator_dry_run if dry_run is None else dry_run,
            default_cadence_hours=self.default_cadence_hours,
        )
