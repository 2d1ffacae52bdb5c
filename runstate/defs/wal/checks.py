"""`wal_lag`: the alert. It fails when the oldest Pending WAL row is older than an hour."""

import dagster as dg

from runstate.defs.tags import HOUSEKEEPING_TAGS
from runstate.defs.wal.assets import dataset_snapshots
from runstate.defs.wal.resources import WalResource
from runstate.wal import oldest_pending_age_s

MAX_PENDING_AGE_S = 3600
# Evaluated every 10 minutes by its AutomationCondition (runstate_automation), not only after a flush.
WAL_LAG_CRON = "4-59/10 * * * *"


@dg.asset_check(
    asset=dataset_snapshots,
    description="Fails when the oldest Pending WAL row is older than 1 h.",
    automation_condition=dg.AutomationCondition.cron_tick_passed(WAL_LAG_CRON),
)
def wal_lag(wal: WalResource) -> dg.AssetCheckResult:
    age = oldest_pending_age_s(wal.wal_table())
    return dg.AssetCheckResult(
        passed=age is None or age <= MAX_PENDING_AGE_S,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={"oldest_pending_age_s": float(age or 0.0), "max_pending_age_s": MAX_PENDING_AGE_S},
        description=None if age is None else f"oldest Pending WAL row is {age:.0f} s old",
    )


# The check on its own, from the launchpad or a script.
wal_lag_job = dg.define_asset_job(
    "wal_lag_check",
    selection=dg.AssetSelection.checks(wal_lag),
    description="Evaluate the wal_lag check: fail when the oldest Pending WAL row is older than 1 h.",
    tags=HOUSEKEEPING_TAGS,
)
