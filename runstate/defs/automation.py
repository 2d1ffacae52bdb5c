"""`runstate_automation`: the sensor that evaluates this code location's AutomationConditions.

Today: `table_inventory` hourly at :50 and the `wal_lag` check every 10 minutes. Dagster's own default
automation sensor starts stopped, so a deployment (a guest in someone's instance included) would never run
them; this one starts running. Its cost is bounded: it evaluates only the assets and checks that have a
condition (none of them partitioned), once a minute, and each request is one run.
"""

import dagster as dg

AUTOMATION_INTERVAL_S = 60

automation_sensor = dg.AutomationConditionSensorDefinition(
    "runstate_automation",
    target=dg.AssetSelection.all() | dg.AssetSelection.all_asset_checks(),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=AUTOMATION_INTERVAL_S,
    description="Evaluates the AutomationConditions: table_inventory hourly at :50, the wal_lag check every "
    "10 minutes.",
)

defs = dg.Definitions(sensors=[automation_sensor])
