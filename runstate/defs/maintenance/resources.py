"""`MaintenanceResource` (key `maintenance`): the Postgres MaintenanceStore plus every maintenance knob.

Configuration plus a factory: the fields of `MaintenanceConfig` (its defaults, theirs); the store is
built through `runstate.wiring`, and nothing connects until `get_store()` is first called. The Spark
session comes from the shared `spark` resource (`runstate.defs.spark.SparkResource`).
"""

from __future__ import annotations

import dagster as dg
from pydantic import Field, PrivateAttr

from runstate import wiring
from runstate.defs.config_fields import config_of
from runstate.maintenance.config import MaintenanceConfig
from runstate.maintenance.health import HealthThresholds
from runstate.maintenance.options import ActionSettings
from runstate.maintenance.orchestrator import OrchestratorSettings
from runstate.maintenance.store import MaintenanceStore


class MaintenanceResource(dg.ConfigurableResource):
    """The maintenance service: job queue, table locks, catalog cache and health history in Postgres."""

    dsn: str = Field(default=MaintenanceConfig.dsn, description="Postgres DSN.")
    # `schema` would shadow pydantic's BaseModel.schema, hence pg_schema (as in EventStoreResource).
    pg_schema: str = Field(
        default=MaintenanceConfig.pg_schema, description="Postgres schema holding the maintenance tables."
    )
    ensure_schema: bool = Field(
        default=True, description="Apply pending migrations when the store is first opened."
    )
    max_attempts: int = Field(
        default=MaintenanceConfig.max_attempts, description="Claims of one job before it fails for good."
    )
    lease_seconds: float = Field(
        default=MaintenanceConfig.lease_seconds,
        description="Claim lease; heartbeats extend it while a job runs.",
    )
    lock_ttl_seconds: float | None = Field(
        default=MaintenanceConfig.lock_ttl_seconds,
        description="Table lock expiry, refreshed with each heartbeat; default: the lease.",
    )
    max_worker_runs: int = Field(
        default=MaintenanceConfig.max_worker_runs,
        description="W: iceberg_maintenance worker runs alive at once.",
    )
    worker_budget_seconds: float = Field(
        default=MaintenanceConfig.worker_budget_seconds,
        description="A worker run claims no new job after this long (a job is never cut short).",
    )
    worker_name: str = Field(
        default=MaintenanceConfig.worker_name,
        description="Prefix of job_queue.claimed_by (plus the run id); one per deployment sharing a schema, "
        "since the sensor releases the claims of this prefix whose run is dead.",
    )
    # Health thresholds (defaults: Snowpack's anchors).
    small_file_mb: float = Field(
        default=MaintenanceConfig.small_file_mb, description="Data files under this size count as small."
    )
    min_small_files: int = Field(
        default=MaintenanceConfig.min_small_files,
        description="Small files needed before compaction is recommended.",
    )
    max_snapshots: int = Field(
        default=MaintenanceConfig.max_snapshots, description="More snapshots recommend expire_snapshots."
    )
    max_snapshot_age_hours: float = Field(
        default=MaintenanceConfig.max_snapshot_age_hours,
        description="An older oldest snapshot recommends expiry.",
    )
    max_delete_files: int = Field(
        default=MaintenanceConfig.max_delete_files,
        description="More delete files recommend rewrite_position_delete_files.",
    )
    max_manifests: int = Field(
        default=MaintenanceConfig.max_manifests, description="More manifests recommend rewrite_manifests."
    )
    apply_deletes_at: int = Field(
        default=MaintenanceConfig.apply_deletes_at,
        description="A dataset table whose merge leaves this many delete files gets a job applying them "
        "(apply_deletes_sensor); 0 leaves them to the orchestrator.",
    )
    # Action defaults (a job's options override them).
    target_file_size_bytes: int = Field(
        default=MaintenanceConfig.target_file_size_bytes, description="rewrite_data_files target file size."
    )
    expire_older_than_hours: float = Field(
        default=MaintenanceConfig.expire_older_than_hours,
        description="expire_snapshots older_than, as an age.",
    )
    retain_last: int = Field(
        default=MaintenanceConfig.retain_last, description="expire_snapshots retain_last."
    )
    orphan_older_than_hours: float = Field(
        default=MaintenanceConfig.orphan_older_than_hours,
        description="remove_orphan_files older_than (>= 24).",
    )
    # Orchestrator and retention.
    orchestrator_dry_run: bool = Field(
        default=MaintenanceConfig.orchestrator_dry_run, description="Advisory only: record, never submit."
    )
    default_cadence_hours: int = Field(
        default=MaintenanceConfig.default_cadence_hours,
        description="Minimum hours between jobs of one table (a job that only applied delete files does "
        "not count).",
    )
    health_keep_days: float = Field(
        default=MaintenanceConfig.health_keep_days, description="health_snapshots retention."
    )

    _store: MaintenanceStore | None = PrivateAttr(default=None)

    def config(self) -> MaintenanceConfig:
        return config_of(self, MaintenanceConfig)

    def get_store(self) -> MaintenanceStore:
        if self._store is None:
            store = wiring.maintenance_store(self.config())
            if self.ensure_schema:
                store.ensure_schema()
            self._store = store
        return self._store

    def worker_id(self, run_id: str) -> str:
        """The claimed_by of the worker run `run_id`: the sensor finds a claim's run by it."""
        return f"{self.worker_prefix}{run_id[:8]}"

    @property
    def worker_prefix(self) -> str:
        return f"{self.worker_name}:"

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._store is not None:
            self._store.close()

    def thresholds(self) -> HealthThresholds:
        return self.config().thresholds()

    def action_settings(self) -> ActionSettings:
        return self.config().action_settings()

    def orchestrator_settings(self, dry_run: bool | None = None) -> OrchestratorSettings:
        return self.config().orchestrator_settings(dry_run)
