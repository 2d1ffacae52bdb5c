"""Dagster definitions for Iceberg maintenance: inventory and health assets, the queue sensor
(worker runs) and the apply-deletes sensor (dataset tables), the maintenance/submit/orchestrator/health-sync
jobs and the sweep schedules.
The `spark` resource is shared."""

from __future__ import annotations

import dagster as dg

from runstate.defs.maintenance.apply_deletes import apply_deletes_sensor
from runstate.defs.maintenance.assets import table_health, table_inventory
from runstate.defs.maintenance.health_sync import table_health_sync
from runstate.defs.maintenance.jobs import (
    iceberg_maintenance,
    maintenance_claim_sweep,
    maintenance_health_retention,
    maintenance_lock_sweep,
    maintenance_orchestrator_job,
    submit_maintenance,
    table_inventory_job,
)
from runstate.defs.maintenance.schedules import SCHEDULES
from runstate.defs.maintenance.sensors import maintenance_queue_sensor
from runstate.defs.resources import maintenance_resource


def build_defs(resources: dict | None = None) -> dg.Definitions:
    """The maintenance domain; tests pass their own `maintenance` (and `spark`) resources."""
    return dg.Definitions(
        assets=[table_inventory, table_health],
        jobs=[
            iceberg_maintenance,
            submit_maintenance,
            maintenance_orchestrator_job,
            maintenance_claim_sweep,
            maintenance_lock_sweep,
            maintenance_health_retention,
            table_inventory_job,
            table_health_sync,
        ],
        sensors=[maintenance_queue_sensor, apply_deletes_sensor],
        schedules=SCHEDULES,
        resources=resources if resources is not None else {"maintenance": maintenance_resource()},
    )


defs = build_defs()
