"""A table's figures around an action: exact, of one snapshot, and cheap (health reuse, opt-in canary)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from runstate.maintenance.actions import ActionRunner
from runstate.maintenance.figures import current_snapshot, table_figures
from runstate.maintenance.health import HealthAnalyzer
from runstate.maintenance.identifiers import TableRef
from runstate.maintenance.options import ActionSettings
from runstate_tests.support.maintenance import make_table

pytestmark = pytest.mark.spark


def metadata_figures(spark, name: str) -> dict[str, int]:
    """The figures the long way: a query per metadata table."""
    data = spark.table(f"{name}.data_files").selectExpr(
        "count(*) AS n", "coalesce(sum(file_size_in_bytes), 0) AS b"
    )
    row = data.first()
    return {
        "data_files": row["n"],
        "data_bytes": row["b"],
        "delete_files": spark.table(f"{name}.delete_files").count(),
        "manifests": spark.table(f"{name}.manifests").count(),
    }


def test_figures_match_the_metadata_tables_and_name_their_snapshot(spark, iceberg_namespace):
    ref = make_table(spark, iceberg_namespace, files=6, rows=600, deletes=True)
    name = ref.in_catalog("lake")
    [current] = spark.sql(
        f"SELECT snapshot_id FROM {name}.snapshots ORDER BY committed_at DESC LIMIT 1"
    ).collect()

    figures = table_figures(spark, ref)

    assert figures == {**metadata_figures(spark, name), "snapshot_id": current["snapshot_id"]}
    assert figures["delete_files"] > 0 and "canary_planning_ms" not in figures


def test_a_table_without_delete_files_is_figured_from_its_snapshot_summary_without_a_spark_job(
    spark, iceberg_namespace
):
    ref = make_table(spark, iceberg_namespace, files=6, rows=600)
    name = ref.in_catalog("lake")
    spark.sql(f"CALL lake.system.rewrite_data_files(table => '{ref.key}')").collect()  # a second snapshot
    expected = metadata_figures(spark, name)
    tracker = spark.sparkContext.statusTracker()

    spark.sparkContext.setJobGroup("figures", "table_figures from the summary")
    try:
        figures = table_figures(spark, ref)
    finally:
        spark.sparkContext.setJobGroup("", "")

    assert {key: figures[key] for key in expected} == expected and expected["data_files"] == 1
    assert list(tracker.getJobIdsForGroup("figures")) == []


def test_an_empty_table_has_zero_figures(spark, iceberg_namespace):
    spark.sql(f"CREATE TABLE lake.`{iceberg_namespace}`.`empty` (id BIGINT) USING iceberg")
    figures = table_figures(spark, TableRef(iceberg_namespace, "empty"))

    assert figures == {
        "snapshot_id": None,
        "manifests": 0,
        "data_files": 0,
        "data_bytes": 0,
        "delete_files": 0,
    }


def test_a_health_row_of_the_current_snapshot_answers_and_a_stale_one_does_not(spark, iceberg_namespace):
    ref = make_table(spark, iceberg_namespace, files=4, rows=400)
    health = HealthAnalyzer(spark).analyze(ref)
    exact = table_figures(spark, ref)
    assert health.snapshot_id == exact["snapshot_id"]
    # Marked numbers show which source answered.
    marked = replace(health, total_data_files=1000, total_size_bytes=7, total_delete_files=3)

    assert table_figures(spark, ref, known=marked) == {
        **exact,
        "data_files": 1000,
        "data_bytes": 7,
        "delete_files": 3,
    }
    assert table_figures(spark, ref, known=replace(marked, snapshot_id=health.snapshot_id + 1)) == exact
    assert table_figures(spark, ref, known=replace(marked, error="manifests: boom")) == exact


def test_health_file_metrics_are_those_of_its_snapshot(spark, iceberg_namespace):
    ref = make_table(spark, iceberg_namespace, files=5, rows=500, deletes=True)

    health = HealthAnalyzer(spark).analyze(ref)

    figures = metadata_figures(spark, ref.in_catalog("lake"))
    assert health.error is None
    assert health.snapshot_id == current_snapshot(spark, ref.in_catalog("lake"))[0]
    assert (
        health.total_data_files,
        health.total_size_bytes,
        health.total_delete_files,
        health.manifest_count,
    ) == (
        figures["data_files"],
        figures["data_bytes"],
        figures["delete_files"],
        figures["manifests"],
    )


def test_canary_planning_is_timed_only_when_the_job_asks(spark, iceberg_namespace):
    ref = make_table(spark, iceberg_namespace, files=2, rows=20, deletes=False)

    plain = ActionRunner(spark, ref).figures()
    timed = ActionRunner(spark, ref, ActionSettings.from_options({"canary_planning": True})).figures()

    assert "canary_planning_ms" not in plain and timed["canary_planning_ms"] > 0


def test_canary_planning_must_be_a_flag():
    with pytest.raises(ValueError, match="canary_planning"):
        ActionSettings.from_options({"canary_planning": "yes"})
