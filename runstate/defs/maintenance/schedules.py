"""Maintenance schedules: the hourly orchestrator, the sweeps, health sync and health retention.

They start jobs, not assets' materializations, so they stay schedules; the inventory (an asset) runs hourly
by its AutomationCondition (runstate.defs.maintenance.assets.INVENTORY_CRON)."""

from __future__ import annotations

import dagster as dg

from runstate.defs.maintenance.health_sync import table_health_sync_schedule
from runstate.defs.maintenance.jobs import (
    maintenance_claim_sweep,
    maintenance_health_retention,
    maintenance_lock_sweep,
    maintenance_orchestrator_job,
)


def _running(
    name: str, cron: str, job: dg.JobDefinition, description: str | None = None
) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name=name,
        cron_schedule=cron,
        job=job,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=description,
    )


# Each run is a process that loads the code location, so no two schedules of the deployment start in the
# same minute (the AutomationConditions' crons included): the sweeps at :02/:03 (+5), the WAL lag check at
# :04 (+10), health sync at :20, the inventory at :50 (just before the orchestrator reads it), the
# orchestrator on the hour; daily jobs at 03:10, 03:30 and 03:40 UTC.
SCHEDULES = [
    _running(
        "maintenance_orchestrator",
        "0 * * * *",
        maintenance_orchestrator_job,
        "Hourly: assess opted-in tables and submit maintenance for unhealthy ones.",
    ),
    _running("maintenance_stale_claim_sweep", "2-59/5 * * * *", maintenance_claim_sweep),
    _running("maintenance_lock_sweep", "3-59/5 * * * *", maintenance_lock_sweep),
    _running("maintenance_health_retention", "30 3 * * *", maintenance_health_retention),
    table_health_sync_schedule,
]
