"""The orchestrator's retention and orphan rules, and their effect on what it submits (real store)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from runstate.maintenance.models import CachedTable, HealthSnapshot
from runstate.maintenance.orchestrator import HEALTHY, SUBMITTED, Orchestrator
from runstate.maintenance.rules import orphan_cleanup_due, orphan_min_age_hours, table_retention

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
DAY_MS = 24 * 3_600_000


def health(db: str, table: str, **values) -> HealthSnapshot:
    values.setdefault("needs_maintenance", False)
    values.setdefault("health_status", HEALTHY)
    return HealthSnapshot(db, table, **values)


def test_retention_comes_from_the_tables_properties():
    assert table_retention({}) is None
    retention = table_retention(
        {"history.expire.max-snapshot-age-ms": str(2 * DAY_MS), "history.expire.min-snapshots-to-keep": "3"}
    )
    assert retention.options() == {"expire_older_than_hours": 48.0, "retain_last": 3}
    assert retention.due(health("d", "t", snapshot_count=4, oldest_snapshot_age_hours=49))
    assert not retention.due(health("d", "t", snapshot_count=3, oldest_snapshot_age_hours=500))
    assert not retention.due(health("d", "t", snapshot_count=40, oldest_snapshot_age_hours=47))
    assert table_retention({"history.expire.max-snapshot-age-ms": "soon"}) is None


@pytest.mark.parametrize(
    "properties, expected",
    [
        ({}, 72.0),
        ({"runstate.maintenance.orphan-min-age-hours": "240"}, 240.0),
        ({"runstate.maintenance.orphan-min-age-hours": "1"}, 72.0),  # never below the safe default
        ({"runstate.maintenance.orphan-min-age-hours": "nan"}, 72.0),
    ],
)
def test_the_orphan_minimum_age_is_never_lowered(properties, expected):
    assert orphan_min_age_hours(properties) == expected


def test_orphan_cleanup_is_due_by_interval_or_once_the_table_is_old_enough():
    young, old = (
        health("d", "t", oldest_snapshot_age_hours=10),
        health("d", "t", oldest_snapshot_age_hours=80),
    )
    assert not orphan_cleanup_due(young, None, NOW, 72, 168)
    assert orphan_cleanup_due(old, None, NOW, 72, 168)
    assert not orphan_cleanup_due(old, NOW - timedelta(hours=100), NOW, 72, 168)
    assert orphan_cleanup_due(young, NOW - timedelta(hours=169), NOW, 72, 168)


def test_the_orchestrator_submits_expiry_and_orphan_cleanup_with_the_tables_own_options(store):
    retention = {
        "history.expire.max-snapshot-age-ms": str(DAY_MS),
        "history.expire.min-snapshots-to-keep": "2",
    }
    store.cache.replace_table_cache(
        [
            CachedTable("db", "kept", True, {"properties": retention}),
            CachedTable("db", "young", True, {"properties": retention}),
        ]
    )
    measured = {
        "kept": health("db", "kept", snapshot_count=9, oldest_snapshot_age_hours=100),
        # The thresholds ask for expiry (200 snapshots), but its own retention keeps them all: nothing due.
        "young": health(
            "db",
            "young",
            snapshot_count=200,
            oldest_snapshot_age_hours=5,
            recommended_actions=["expire_snapshots"],
            needs_maintenance=True,
        ),
    }

    report = Orchestrator(store, lambda ref: measured[ref.table], now=lambda: NOW).run()

    decided = {d.table_key: d for d in report.decisions}
    assert decided["db.young"].decision == HEALTHY
    kept = decided["db.kept"]
    assert kept.decision == SUBMITTED and kept.recommended_actions == [
        "expire_snapshots",
        "remove_orphan_files",
    ]
    job = store.queue.get_job(kept.job_id)
    assert job.options == {"expire_older_than_hours": 24.0, "retain_last": 2, "orphan_older_than_hours": 72.0}


def test_expiry_the_default_retention_cannot_do_is_not_submitted(store):
    store.cache.replace_table_cache([CachedTable("db", "young", True, {})])
    # 200 snapshots ask for expiry, but all are younger than the default retention's 72 h.
    measured = health(
        "db",
        "young",
        snapshot_count=200,
        oldest_snapshot_age_hours=5,
        recommended_actions=["expire_snapshots"],
    )

    report = Orchestrator(store, lambda ref: measured, now=lambda: NOW).run()

    assert [d.decision for d in report.decisions] == [HEALTHY] and store.queue.list_jobs() == []
