"""`MaintenanceResource` (key `maintenance`): the Postgres MaintenanceStore plus every maintenance knob.

Configuration plus a factory: nothing connects until `get_store()` is first called. The Spark
session comes from the shared `spark` resource (`runstate.defs.spark.SparkResource`).
"""

from __future__ import annotations

import dagster as dg
from pydantic import Field, PrivateAttr

from runstate.config import DEFAULT_PG_URL
from runstate.maintenance.health import MB, HealthThresholds
from runstate.maintenance.options import ActionSettings
from runstate.maintenance.orchestrator import OrchestratorSettings
from runstate.maintenance.store import MaintenanceStore


class MaintenanceResource(dg.ConfigurableResource):
    """The maintenance service: job queue, table locks, catalog cache and health history in Postgres."""

    dsn: str = Field(default=DEFAULT_PG_URL, description="Postgres DSN.")
    # `schema` would shadow pydantic's BaseModel.schema, hence pg_schema (as in EventStoreResource).
    pg_schema: str = Field(default="runstate", description="Postgres schema holding the maintenance tables.")
    ensure_schema: bool = Field(
        default=True, description="Apply pending migrations when the store is first opened."
    )
    max_attempts: int = Field(default=3, description="Claims of one job before it fails for good.")
    lease_seconds: float = Field(
        default=900.0, description="Claim lease; heartbeats extend it while a job runs."
    )
    lock_ttl_seconds: float | None = Field(
        default=None, description="Table lock expiry, refreshed with each heartbeat; default: the lease."
    )
    max_worker_runs: int = Field(default=2, description="W: iceberg_maintenance worker runs alive at once.")
    worker_budget_seconds: float = Field(
        default=1800.0,
        description="A worker run claims no new job after this long (a job is never cut short).",
    )
    worker_name: str = Field(
        default="dagster",
        description="Prefix of job_queue.claimed_by (plus the run id); one per deployment sharing a schema, "
        "since the sensor releases the claims of this prefix whose run is dead.",
    )
    # Health thresholds (defaults: Snowpack's anchors).
    small_file_mb: float = Field(default=16.0, description="Data files under this size count as small.")
    min_small_files: int = Field(
        default=5, description="Small files needed before compaction is recommended."
    )
    max_snapshots: int = Field(default=100, description="More snapshots recommend expire_snapshots.")
    max_snapshot_age_hours: float = Field(
        default=168.0, description="An older oldest snapshot recommends expiry."
    )
    max_delete_files: int = Field(
        default=0, description="More delete files recommend rewrite_position_delete_files."
    )
    max_manifests: int = Field(default=100, description="More manifests recommend rewrite_manifests.")
    apply_deletes_at: int = Field(
        default=8,
        description="A dataset table whose merge leaves this many delete files gets a job applying them "
        "(apply_deletes_sensor); 0 leaves them to the orchestrator.",
    )
    # Action defaults (a job's options override them).
    target_file_size_bytes: int = Field(default=128 * MB, description="rewrite_data_files target file size.")
    expire_older_than_hours: float = Field(
        default=72.0, description="expire_snapshots older_than, as an age."
    )
    retain_last: int = Field(default=10, description="expire_snapshots retain_last.")
    orphan_older_than_hours: float = Field(
        default=72.0, description="remove_orphan_files older_than (>= 24)."
    )
    # Orchestrator and retention.
    orchestrator_dry_run: bool = Field(default=False, description="Advisory only: record, never submit.")
    default_cadence_hours: int = Field(
        default=24,
        description="Minimum hours between jobs of one table (a job that only applied delete files does "
        "not count).",
    )
    health_keep_days: float = Field(default=30.0, description="health_snapshots retention.")

    _store: MaintenanceStore | None = PrivateAttr(default=None)

    def get_store(self) -> MaintenanceStore:
        if self._store is None:
            store = MaintenanceStore(self.dsn, schema=self.pg_schema, max_attempts=self.max_attempts)
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
