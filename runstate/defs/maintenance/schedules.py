"""Maintenance schedules: inventory sync, the hourly orchestrator, the sweeps and health retention."""

from __future__ import annotations

import dagster as dg

from runstate.defs.maintenance.health_sync import table_health_sync_schedule
from runstate.defs.maintenance.jobs import (
    maintenance_claim_sweep,
    maintenance_health_retention,
    maintenance_lock_sweep,
    maintenance_orchestrator_job,
    table_inventory_job,
)

RUNNING = dg.DefaultScheduleStatus.RUNNING

# Each run is a process that loads the code location, so no two schedules of the deployment start in the
# same minute: the sweeps at :02/:03 (+5), the WAL lag check at :04 (+10), health sync at :20, the
# inventory at :50, the orchestrator on the hour; daily jobs at 03:10, 03:30 and 03:40 UTC.

# The inventory refreshes just before the orchestrator reads it.
table_inventory_schedule = dg.ScheduleDefinition(
    name="table_inventory_sync",
    cron_schedule="50 * * * *",
    job=table_inventory_job,
    default_status=RUNNING,
)
maintenance_orchestrator = dg.ScheduleDefinition(
    name="maintenance_orchestrator",
    cron_schedule="0 * * * *",
    job=maintenance_orchestrator_job,
    default_status=RUNNING,
    description="Hourly: assess opted-in tables and submit maintenance for unhealthy ones.",
)
maintenance_claim_sweep_schedule = dg.ScheduleDefinition(
    name="maintenance_stale_claim_sweep",
    cron_schedule="2-59/5 * * * *",
    job=maintenance_claim_sweep,
    default_status=RUNNING,
)
maintenance_lock_sweep_schedule = dg.ScheduleDefinition(
    name="maintenance_lock_sweep",
    cron_schedule="3-59/5 * * * *",
    job=maintenance_lock_sweep,
    default_status=RUNNING,
)
maintenance_health_retention_schedule = dg.ScheduleDefinition(
    name="maintenance_health_retention",
    cron_schedule="30 3 * * *",
    job=maintenance_health_retention,
    default_status=RUNNING,
)

SCHEDULES = [
    table_inventory_schedule,
    maintenance_orchestrator,
    maintenance_claim_sweep_schedule,
    maintenance_lock_sweep_schedule,
    maintenance_health_retention_schedule,
    table_health_sync_schedule,
]
