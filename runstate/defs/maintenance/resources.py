"""`MaintenanceResource` (key `maintenance`): the Postgres MaintenanceStore plus every maintenance knob.

Configuration plus a factory: the fields of `MaintenanceConfig` (derived from it); the store is
built through `runstate.wiring`, and nothing connects until `get_store()` is first called. The Spark
session comes from the shared `spark` resource (`runstate.defs.spark.SparkResource`).
"""

from __future__ import annotations

import dagster as dg
from pydantic import Field, PrivateAttr

from runstate import wiring
from runstate.defs.config_fields import config_of, config_resource
from runstate.maintenance.config import MaintenanceConfig
from runstate.maintenance.health import HealthThresholds
from runstate.maintenance.options import ActionSettings
from runstate.maintenance.orchestrator import OrchestratorSettings
from runstate.maintenance.store import MaintenanceStore


class MaintenanceResource(config_resource(MaintenanceConfig)):
    """The maintenance service: job queue, table locks, catalog cache and health history in Postgres."""

    ensure_schema: bool = Field(
        default=True, description="Apply pending migrations when the store is first opened."
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
