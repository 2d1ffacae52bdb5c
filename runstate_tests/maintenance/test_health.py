"""The health analyzer: the verdict from thresholds (pure), and every column from real Iceberg metadata."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from runstate.maintenance.health import (
    HEALTHY,
    NEEDS_MAINTENANCE,
    UNKNOWN,
    HealthAnalyzer,
    HealthThresholds,
    TableNotFound,
    apply_verdict,
)
from runstate.maintenance.identifiers import TableRef
from runstate.maintenance.models import HealthSnapshot
from runstate.maintenance.store import MaintenanceStore
from runstate_tests.support.maintenance import make_table as shared_make_table

MB = 1024 * 1024


def healthy_metrics(**changes) -> HealthSnapshot:
    base = HealthSnapshot(
        "db",
        "t",
        needs_maintenance=False,
        total_data_files=4,
        total_size_bytes=4 * 200 * MB,
        small_file_count=0,
        snapshot_count=3,
        manifest_count=2,
        oldest_snapshot_age_hours=10,
    )
    return dataclasses.replace(base, **changes)


def verdict(
    health: HealthSnapshot, thresholds: HealthThresholds | None = None, complete: bool = True
) -> HealthSnapshot:
    return apply_verdict(health, thresholds or HealthThresholds(), metrics_complete=complete)


def test_a_table_under_every_threshold_is_healthy():
    health = verdict(healthy_metrics())
    assert (health.health_status, health.needs_maintenance, health.recommended_actions) == (
        HEALTHY,
        False,
        [],
    )


@pytest.mark.parametrize(
    "changes, action",
    [
        ({"small_file_count": 5}, "rewrite_data_files"),
        ({"manifest_count": 101}, "rewrite_manifests"),
        ({"snapshot_count": 101}, "expire_snapshots"),
        ({"oldest_snapshot_age_hours": 7 * 24 + 1}, "expire_snapshots"),
    ],
)
def test_each_default_threshold_recommends_its_action(changes, action):
    health = verdict(healthy_metrics(**changes))
    assert health.recommended_actions == [action]
    assert health.needs_maintenance and health.health_status == NEEDS_MAINTENANCE


@pytest.mark.parametrize(
    "changes",
    [
        {"small_file_count": 4},
        {"manifest_count": 100},
        {"snapshot_count": 100},
        {"oldest_snapshot_age_hours": 168},
    ],
)
def test_at_the_threshold_nothing_is_recommended(changes):
    assert verdict(healthy_metrics(**changes)).recommended_actions == []


def test_recommendations_come_in_execution_order():
    health = verdict(
        healthy_metrics(snapshot_count=500, manifest_count=500, total_delete_files=3, small_file_count=9)
    )
    assert health.recommended_actions == [
        "rewrite_data_files",
        "rewrite_position_delete_files",
        "rewrite_manifests",
        "expire_snapshots",
    ]


def test_thresholds_are_configurable():
    strict = HealthThresholds(max_snapshots=2, max_manifests=1, min_small_files=1)
    health = verdict(healthy_metrics(small_file_count=1), strict)
    assert health.recommended_actions == ["rewrite_data_files", "rewrite_manifests", "expire_snapshots"]


def test_a_partial_report_that_finds_nothing_is_unknown_not_healthy():
    assert verdict(healthy_metrics(), complete=False).health_status == UNKNOWN


# -- real Spark + Iceberg -------------------------------------------------------------------------


def make_table(spark, namespace: str, name: str = "events", **knobs) -> TableRef:
    return shared_make_table(
        spark, namespace, name, **{"files": 8, "rows": 800, "deletes": True, "enabled": None, **knobs}
    )


@pytest.mark.spark
def test_the_analyzer_fills_every_column_and_the_row_round_trips(
    spark, iceberg_namespace, pg_database, pg_schema
):
    ref = make_table(
        spark,
        iceberg_namespace,
        properties=("'runstate.maintenance.enabled'='true', 'runstate.maintenance.cadence-hours'='6'"),
    )
    current = int(dict(spark.sql(f"SHOW TBLPROPERTIES lake.{ref.quoted}").collect())["current-snapshot-id"])

    health = HealthAnalyzer(spark).analyze(ref)

    assert (health.total_data_files, health.total_delete_files, health.total_records) == (8, 8, 800)
    assert health.small_file_count == 8 and health.small_file_pct == 100.0
    assert health.total_size_bytes > 0 and health.avg_file_size_bytes == health.total_size_bytes / 8
    assert health.snapshot_count == 2 and health.snapshot_id == current
    assert health.manifest_count == 2  # one data manifest, one delete manifest
    assert 0 <= health.hours_since_last_snapshot <= health.oldest_snapshot_age_hours < 1
    assert (health.maintenance_enabled, health.maintenance_cadence_hours) == (True, 6)
    assert health.recommended_actions == ["rewrite_data_files", "rewrite_position_delete_files"]
    assert (
        health.health_status == NEEDS_MAINTENANCE and health.error is None and health.checked_at is not None
    )
    with MaintenanceStore(pg_database, schema=pg_schema) as store:
        store.ensure_schema()
        store.history.insert_health_snapshot(health)
        stored = store.history.latest_health(ref)
    assert stored.total_data_files == 8 and stored.snapshot_id == current
    assert list(stored.recommended_actions) == health.recommended_actions
    assert stored.maintenance_cadence_hours == 6 and stored.health_status == NEEDS_MAINTENANCE


@pytest.mark.spark
def test_opt_in_is_none_when_unset_or_unrecognised(spark, iceberg_namespace):
    unset = make_table(spark, iceberg_namespace, "unset", files=1, rows=10, deletes=False)
    odd = make_table(
        spark,
        iceberg_namespace,
        "odd",
        files=1,
        rows=10,
        deletes=False,
        properties="'runstate.maintenance.enabled'='perhaps', 'runstate.maintenance.cadence-hours'='x'",
    )
    off = make_table(
        spark,
        iceberg_namespace,
        "off",
        files=1,
        rows=10,
        deletes=False,
        properties="'runstate.maintenance.enabled'='false'",
    )
    analyzer = HealthAnalyzer(spark)

    assert analyzer.analyze(unset).maintenance_enabled is None
    assert (analyzer.analyze(odd).maintenance_enabled, analyzer.analyze(odd).maintenance_cadence_hours) == (
        None,
        None,
    )
    off_health = analyzer.analyze(off)
    assert off_health.maintenance_enabled is False and off_health.health_status == HEALTHY


@pytest.mark.spark
def test_old_snapshots_recommend_expiry(spark, iceberg_namespace):
    ref = make_table(spark, iceberg_namespace, files=1, rows=10, deletes=False)
    eight_days_on = lambda: datetime.now(UTC) + timedelta(days=8)  # noqa: E731

    health = HealthAnalyzer(spark, now=eight_days_on).analyze(ref)

    assert health.oldest_snapshot_age_hours > 7 * 24
    assert health.recommended_actions == ["expire_snapshots"]


@pytest.mark.spark
def test_a_missing_table_is_the_one_fatal_error(spark, iceberg_namespace):
    with pytest.raises(TableNotFound, match=f"{iceberg_namespace}.nope"):
        HealthAnalyzer(spark).analyze(TableRef(iceberg_namespace, "nope"))


@pytest.mark.spark
def test_a_broken_manifest_is_recorded_in_error_and_the_rest_is_still_measured(spark, iceberg_namespace):
    ref = make_table(spark, iceberg_namespace, files=3, rows=30, deletes=False)
    manifest = Path(spark.table(f"lake.{ref.quoted}.manifests").first()["path"].replace("file:", "", 1))
    saved = manifest.read_bytes()
    manifest.unlink()  # a storage fault under one manifest
    try:
        health = HealthAnalyzer(spark).analyze(ref)
    finally:
        manifest.write_bytes(saved)  # so the namespace fixture can drop the table

    assert health.error and "files: " in health.error
    assert health.snapshot_count == 1 and health.manifest_count == 1
    assert health.health_status == UNKNOWN


def test_delete_files_recommend_applying_them_then_dropping_the_dangling_ones():
    # rewrite_position_delete_files alone only combines delete files: on 2 of them it changed nothing.
    health = verdict(healthy_metrics(total_delete_files=1))
    assert health.recommended_actions == ["rewrite_data_files", "rewrite_position_delete_files"]
