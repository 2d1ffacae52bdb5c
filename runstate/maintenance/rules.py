"""The orchestrator's rules for the two actions that health thresholds alone cannot decide.

- expire_snapshots follows each table's own retention properties (Iceberg's
  `history.expire.max-snapshot-age-ms` and `history.expire.min-snapshots-to-keep`): it is due when
  more snapshots than the table keeps are older than the table's maximum age, and the job is
  submitted with exactly that age and count.
- remove_orphan_files only ever deletes files older than a safe minimum age (default 3 days; a
  table's `runstate.maintenance.orphan-min-age-hours` may raise it, never lower it below Iceberg's
  24 h): files younger than that may belong to a writer that has not committed yet. It is due every
  `interval` hours; a table that never had it is due once its oldest snapshot is older than the age.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from runstate.maintenance.models import HealthSnapshot
from runstate.maintenance.options import MAX_AGE_HOURS, MAX_RETAIN_LAST, MIN_ORPHAN_AGE_HOURS

MAX_AGE_PROPERTY = "history.expire.max-snapshot-age-ms"
MIN_SNAPSHOTS_PROPERTY = "history.expire.min-snapshots-to-keep"
ORPHAN_AGE_PROPERTY = "runstate.maintenance.orphan-min-age-hours"
DEFAULT_ORPHAN_MIN_AGE_HOURS = 72.0
DEFAULT_ORPHAN_INTERVAL_HOURS = 7 * 24.0


@dataclass(frozen=True)
class Retention:
    """A table's snapshot retention, in the units of the expire_snapshots options."""

    older_than_hours: float
    retain_last: int

    def options(self) -> dict[str, Any]:
        return {"expire_older_than_hours": self.older_than_hours, "retain_last": self.retain_last}

    def due(self, health: HealthSnapshot) -> bool:
        """Some snapshot would expire: more than retain_last, and the oldest is past the age."""
        return (
            health.snapshot_count > self.retain_last
            and health.oldest_snapshot_age_hours > self.older_than_hours
        )


def _number(properties: Mapping[str, Any], key: str) -> float | None:
    try:
        value = float(str(properties.get(key, "")).strip())
    except ValueError:
        return None
    return value if value >= 0 and value == value else None  # a bad property must not stop the pass


def table_retention(properties: Mapping[str, Any]) -> Retention | None:
    """The retention the table's properties set, or None when it sets none (the thresholds decide)."""
    age_ms = _number(properties, MAX_AGE_PROPERTY)
    keep = _number(properties, MIN_SNAPSHOTS_PROPERTY)
    if age_ms is None and keep is None:
        return None
    hours = min(
        age_ms / 3_600_000 if age_ms is not None else 5 * 24.0, float(MAX_AGE_HOURS)
    )  # Iceberg: 5 days
    retain_last = min(max(int(keep), 1), MAX_RETAIN_LAST) if keep is not None else 1  # Iceberg: 1
    return Retention(round(hours, 6), retain_last)


def orphan_min_age_hours(
    properties: Mapping[str, Any], default: float = DEFAULT_ORPHAN_MIN_AGE_HOURS
) -> float:
    """The table's minimum orphan age: its property when that is longer, never under Iceberg's 24 h."""
    asked = _number(properties, ORPHAN_AGE_PROPERTY)
    return min(max(default, asked or 0.0, float(MIN_ORPHAN_AGE_HOURS)), float(MAX_AGE_HOURS))


def orphan_cleanup_due(
    health: HealthSnapshot,
    last_cleanup: datetime | None,
    now: datetime,
    min_age_hours: float,
    interval_hours: float,
) -> bool:
    if last_cleanup is None:
        return health.oldest_snapshot_age_hours >= min_age_hours
    return now - last_cleanup >= timedelta(hours=interval_hours)
