"""The maintenance service's one frozen configuration, parsed once from the Settings (or from the Dagster
resource's fields). Each field's metadata hold its description, which the Dagster resource, whose fields
are derived from these, shows. The defaults of the health thresholds, the action settings and the
orchestrator are those value types' own."""

from __future__ import annotations

from dataclasses import dataclass, field

from runstate.config import Settings
from runstate.maintenance.health import MB, HealthThresholds
from runstate.maintenance.models import DEFAULT_LEASE_SECONDS, DEFAULT_MAX_ATTEMPTS
from runstate.maintenance.options import ActionSettings
from runstate.maintenance.orchestrator import OrchestratorSettings


@dataclass(frozen=True)
class MaintenanceConfig:
    dsn: str = field(default=Settings.pg_url, metadata={"description": "Postgres DSN."})
    # `schema` would shadow pydantic's BaseModel.schema on the Dagster resource, hence pg_schema.
    pg_schema: str = field(
        default=Settings.schema, metadata={"description": "Postgres schema holding the maintenance tables."}
    )
    max_attempts: int = field(
        default=DEFAULT_MAX_ATTEMPTS, metadata={"description": "Claims of one job before it fails for good."}
    )
    lease_seconds: float = field(
        default=DEFAULT_LEASE_SECONDS,  # written once, in models.py (why 15 minutes: there)
        metadata={"description": "Claim lease; heartbeats extend it while a job runs."},
    )
    lock_ttl_seconds: float | None = field(
        default=None,
        metadata={"description": "Table lock expiry, refreshed with each heartbeat; default: the lease."},
    )
    max_worker_runs: int = field(
        default=Settings.maintenance_workers,
        metadata={"description": "W: iceberg_maintenance worker runs alive at once."},
    )
    worker_budget_seconds: float = field(
        default=1800.0,
        metadata={
            "description": "A worker run claims no new job after this long (a job is never cut short)."
        },
    )
    worker_name: str = field(
        default="dagster",
        metadata={
            "description": "Prefix of job_queue.claimed_by (plus the run id); one per deployment sharing a schema, "
            "since the sensor releases the claims of this prefix whose run is dead."
        },
    )
    # Health thresholds (defaults: Snowpack's anchors).
    small_file_mb: float = field(
        default=HealthThresholds.small_file_bytes / MB,
        metadata={"description": "Data files under this size count as small."},
    )
    min_small_files: int = field(
        default=HealthThresholds.min_small_files,
        metadata={"description": "Small files needed before compaction is recommended."},
    )
    max_snapshots: int = field(
        default=HealthThresholds.max_snapshots,
        metadata={"description": "More snapshots recommend expire_snapshots."},
    )
    max_snapshot_age_hours: float = field(
        default=float(HealthThresholds.max_snapshot_age_hours),
        metadata={"description": "An older oldest snapshot recommends expiry."},
    )
    max_delete_files: int = field(
        default=HealthThresholds.max_delete_files,
        metadata={"description": "More delete files recommend rewrite_position_delete_files."},
    )
    max_manifests: int = field(
        default=HealthThresholds.max_manifests,
        metadata={"description": "More manifests recommend rewrite_manifests."},
    )
    apply_deletes_at: int = field(
        default=Settings.apply_deletes_at,
        metadata={
            "description": "A dataset table whose merge leaves this many delete files gets a job applying them "
            "(apply_deletes_sensor); 0 leaves them to the orchestrator."
        },
    )
    # Action defaults (a job's options override them).
    target_file_size_bytes: int = field(
        default=ActionSettings.target_file_size_bytes,
        metadata={"description": "rewrite_data_files target file size."},
    )
    expire_older_than_hours: float = field(
        default=ActionSettings.expire_older_than_hours,
        metadata={"description": "expire_snapshots older_than, as an age."},
    )
    retain_last: int = field(
        default=ActionSettings.retain_last, metadata={"description": "expire_snapshots retain_last."}
    )
    orphan_older_than_hours: float = field(
        default=ActionSettings.orphan_older_than_hours,
        metadata={"description": "remove_orphan_files older_than (>= 24)."},
    )
    # Orchestrator and retention.
    orchestrator_dry_run: bool = field(
        default=OrchestratorSettings.dry_run, metadata={"description": "Advisory only: record, never submit."}
    )
    default_cadence_hours: int = field(
        default=OrchestratorSettings.default_cadence_hours,
        metadata={
            "description": "Minimum hours between jobs of one table (a job that only applied delete files does "
            "not count)."
        },
    )
    health_keep_days: float = field(default=30.0, metadata={"description": "health_snapshots retention."})

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
