"""The `table_is_healthy` asset check: evaluated with each `table_health` partition (one table)."""

from __future__ import annotations

import dagster as dg

from runstate.maintenance.health import HEALTHY
from runstate.maintenance.models import HealthSnapshot

TABLE_IS_HEALTHY = dg.AssetCheckSpec(
    name="table_is_healthy",
    asset="table_health",
    description="The table's latest health report recommends no maintenance and had no analyzer error.",
)


def table_is_healthy(health: HealthSnapshot) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        check_name=TABLE_IS_HEALTHY.name,
        asset_key=TABLE_IS_HEALTHY.asset_key,
        passed=health.health_status == HEALTHY and not health.error,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "table": health.table_key,
            "health_status": health.health_status,
            "recommended_actions": ", ".join(health.recommended_actions) or "none",
            "error": health.error or "",
        },
    )
