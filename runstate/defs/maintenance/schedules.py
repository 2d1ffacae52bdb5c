"""Maintenance schedules: the hourly orchestrator, the sweeps, health sync and health retention.

They start jobs, not assets' materializations, so they stay schedules; the inventory (an asset) runs hourly
by its AutomationCondition (runstate.defs.maintenance.assets.INVENTORY_CRON).

The two sweeps tick every 5 minutes but start their run only when it has something to sweep (an expired
lease, an expired lock): a run is a process that loads the code location (3 to 4 CPU-s), and an idle
deployment started 24 of them an hour to change nothing. The skipped ticks say so in the UI."""

from __future__ import annotations

from collections.abc import Callable

import dagster as dg

from runstate.defs.maintenance.health_sync import table_health_sync_schedule
from runstate.defs.maintenance.jobs import (
    maintenance_claim_sweep,
    maintenance_health_retention,
    maintenance_lock_sweep,
    maintenance_orchestrator_job,
)
from runstate.defs.maintenance.resources import MaintenanceResource
from runstate.maintenance.store import MaintenanceStore


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


def _sweep_when_due(
    name: str,
    cron: str,
    job: dg.JobDefinition,
    description: str,
    due: Callable[[MaintenanceStore], bool],
    nothing_due: str,
) -> dg.ScheduleDefinition:
    @dg.schedule(
        name=name,
        cron_schedule=cron,
        job=job,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=description,
    )
    def sweep(
        context: dg.ScheduleEvaluationContext, maintenance: MaintenanceResource
    ) -> dg.RunRequest | dg.SkipReason:
        return dg.RunRequest() if due(maintenance.get_store()) else dg.SkipReason(nothing_due)

    return sweep


stale_claim_sweep = _sweep_when_due(
    "maintenance_stale_claim_sweep",
    "2-59/5 * * * *",
    maintenance_claim_sweep,
    "Every 5 minutes, when a maintenance claim's lease has expired: return it to the queue.",
    lambda store: store.queue.any_stale_claim(),
    "no maintenance claim's lease has expired",
)
lock_sweep = _sweep_when_due(
    "maintenance_lock_sweep",
    "3-59/5 * * * *",
    maintenance_lock_sweep,
    "Every 5 minutes, when a table lock has expired: delete the expired locks.",
    lambda store: store.locks.any_expired_lock(),
    "no table lock has expired",
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
    stale_claim_sweep,
    lock_sweep,
    _running("maintenance_health_retention", "30 3 * * *", maintenance_health_retention),
    table_health_sync_schedule,
]
