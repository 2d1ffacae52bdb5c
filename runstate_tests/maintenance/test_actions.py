"""Maintenance actions on real Spark + Iceberg: each procedure, its figures, dry runs and bad options."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from runstate.maintenance.actions import ActionRunner
from runstate.maintenance.errors import InvalidActionOption
from runstate.maintenance.identifiers import TableRef
from runstate.maintenance.options import ActionSettings, timestamp_literal
from runstate_tests.support.maintenance import make_table as shared_make_table
from runstate_tests.support.maintenance import table_location

pytestmark = pytest.mark.spark


def make_table(spark, namespace: str, name: str = "events", **knobs) -> TableRef:
    """24 small files with position deletes, not opted in, unless the test says otherwise."""
    return shared_make_table(
        spark, namespace, name, **{"files": 24, "rows": 2400, "deletes": True, "enabled": None, **knobs}
    )


def contents(spark, ref: TableRef) -> list[tuple]:
    return [tuple(r) for r in spark.sql(f"SELECT id, v FROM lake.{ref.quoted} ORDER BY id").collect()]


def file_counts(spark, ref: TableRef) -> tuple[int, int]:
    data = spark.table(f"lake.{ref.quoted}.data_files").count()
    deletes = spark.table(f"lake.{ref.quoted}.delete_files").count()
    return data, deletes


def tree(path: Path) -> dict[str, float]:
    """Every file under the table folder with its mtime: a write anywhere changes it."""
    return {str(p.relative_to(path)): p.stat().st_mtime for p in path.rglob("*") if p.is_file()}


def test_rewrite_data_files_compacts_and_keeps_the_rows(spark, iceberg_namespace):
    ref = make_table(spark, iceberg_namespace)
    before = contents(spark, ref)

    result = ActionRunner(spark, ref).run("rewrite_data_files")

    assert result.success, result.error
    assert result.figures["rewritten_data_files_count"] == 24
    assert result.figures["added_data_files_count"] == 1
    assert "rewritten_data_files_count=24" in result.message
    assert result.elapsed_seconds > 0
    assert file_counts(spark, ref)[0] == 1
    assert contents(spark, ref) == before


def replace_commits(spark, ref: TableRef) -> int:
    return spark.table(f"lake.{ref.quoted}.snapshots").where("operation = 'replace'").count()


def test_a_partitioned_table_commits_its_file_groups_as_they_finish_and_a_plain_one_commits_once(
    spark, iceberg_namespace
):
    plain = make_table(spark, iceberg_namespace, "plain", deletes=False)
    parted = TableRef(iceberg_namespace, "parted")
    spark.sql(f"CREATE TABLE lake.{parted.quoted} (id BIGINT, p INT) USING iceberg PARTITIONED BY (p)")
    for _ in range(6):  # a file per partition per append: 6 small files in each of 3 partitions
        spark.range(30).selectExpr("id", "CAST(id % 3 AS INT) AS p").writeTo(f"lake.{parted.quoted}").append()

    # The plain table is one file group: no commit service (about 0.1 s of a small compaction).
    assert [ActionRunner(spark, ref)._several_file_groups() for ref in (plain, parted)] == [False, True]
    for ref in (plain, parted):
        result = ActionRunner(spark, ref).run("rewrite_data_files")
        assert result.success, result.error

    # Partial progress: one commit per partition's group; without it, one commit for the table.
    assert (replace_commits(spark, plain), replace_commits(spark, parted)) == (1, 3)


def test_rewrite_position_delete_files_drops_deletes_made_dangling_by_compaction(spark, iceberg_namespace):
    ref = make_table(spark, iceberg_namespace, files=8, rows=800)
    before = contents(spark, ref)
    runner = ActionRunner(spark, ref)
    assert runner.run("rewrite_data_files").success

    result = runner.run("rewrite_position_delete_files")

    assert result.success, result.error
    assert result.figures["rewritten_delete_files_count"] == 8
    assert file_counts(spark, ref) == (1, 0)
    assert contents(spark, ref) == before


def test_sort_strategy_with_a_sort_order(spark, iceberg_namespace):
    ref = make_table(spark, iceberg_namespace, files=6, rows=600, deletes=False)
    settings = ActionSettings(rewrite_strategy="sort", sort_order="id DESC NULLS LAST")

    result = ActionRunner(spark, ref, settings).run("rewrite_data_files")

    assert result.success, result.error
    assert result.figures["rewritten_data_files_count"] == 6


def test_expire_snapshots_uses_older_than_and_retain_last(spark, iceberg_namespace):
    ref = make_table(spark, iceberg_namespace, files=4, rows=400)  # 2 snapshots: append, delete
    spark.sql(f"INSERT INTO lake.{ref.quoted} VALUES (100000, 'x')")  # a third
    settings = ActionSettings(expire_older_than_hours=0, retain_last=1)

    result = ActionRunner(spark, ref, settings).run("expire_snapshots")

    assert result.success, result.error
    assert spark.table(f"lake.{ref.quoted}.snapshots").count() == 1
    assert "deleted_manifest_lists_count=2" in result.message


def test_remove_orphan_files_dry_run_reports_and_the_real_run_removes(spark, iceberg_namespace):
    ref = make_table(spark, iceberg_namespace, files=2, rows=20, deletes=False)
    orphan = table_location(spark, ref) / "data" / "orphan-from-a-crashed-writer.parquet"
    orphan.write_bytes(b"not referenced by any snapshot")
    four_days_ago = time.time() - 4 * 24 * 3600
    os.utime(orphan, (four_days_ago, four_days_ago))
    runner = ActionRunner(spark, ref)

    planned = runner.run("remove_orphan_files", dry_run=True)
    assert planned.success, planned.error
    assert planned.figures == {"would_remove_orphan_files_count": 1}
    assert orphan.exists()

    removed = runner.run("remove_orphan_files")
    assert removed.figures == {"removed_orphan_files_count": 1}
    assert not orphan.exists()


def test_dry_run_of_every_action_writes_nothing(spark, iceberg_namespace):
    ref = make_table(spark, iceberg_namespace, files=12, rows=1200)
    location = table_location(spark, ref)
    before_tree, before_rows = tree(location), contents(spark, ref)
    runner = ActionRunner(spark, ref, ActionSettings(expire_older_than_hours=0, retain_last=1))

    results = [
        runner.run(action, dry_run=True)
        for action in (
            "rewrite_data_files",
            "rewrite_position_delete_files",
            "rewrite_manifests",
            "expire_snapshots",
            "remove_orphan_files",
        )
    ]

    assert all(r.success for r in results), [r.error for r in results]
    plans = {r.action: r.figures for r in results}
    assert plans["rewrite_data_files"]["would_rewrite_data_files_count"] == 12
    assert plans["rewrite_position_delete_files"]["would_rewrite_delete_files_count"] == 12
    assert plans["expire_snapshots"]["would_expire_snapshots_count"] == 1
    assert all(r.message.startswith("dry run: ") for r in results)
    assert tree(location) == before_tree
    assert contents(spark, ref) == before_rows


def test_a_failing_procedure_is_an_unsuccessful_result_naming_the_table(spark, iceberg_namespace):
    ref = TableRef(iceberg_namespace, "does_not_exist")

    result = ActionRunner(spark, ref).run("rewrite_manifests")

    assert not result.success
    assert f"rewrite_manifests on {ref.key} failed" in result.error


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"rewrite_strategy": "sort", "sort_order": "id'); DROP TABLE x; --"}, "sort_order term"),
        ({"rewrite_strategy": "sort", "sort_order": "id DESC, v ASC NULLS FIRST; x"}, "sort_order term"),
        ({"rewrite_strategy": "zorder"}, "rewrite_strategy"),
        ({"sort_order": "id"}, "needs rewrite_strategy 'sort'"),
        ({"target_file_size_bytes": "1; DROP"}, "target_file_size_bytes"),
        ({"retain_last": 0}, "retain_last"),
        ({"expire_older_than_hours": float("nan")}, "expire_older_than_hours"),
        ({"orphan_older_than_hours": 1}, "under 24"),
        ({"older_than": "yesterday"}, "unknown maintenance option"),
    ],
)
def test_bad_options_are_refused_before_spark_is_touched(options, fragment):
    with pytest.raises(InvalidActionOption, match=fragment):
        ActionSettings.from_options(options)


def test_timestamp_literal_spells_out_utc():
    from datetime import datetime, timedelta, timezone

    moment = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    assert timestamp_literal(moment) == "TIMESTAMP '2026-01-02 01:04:05.000000+00:00'"
