"""The history tables opt in to maintenance: every action the orchestrator may give them runs on them."""

from __future__ import annotations

import random

import pytest

from runstate.maintenance.actions import ActionRunner
from runstate.maintenance.identifiers import ACTIONS, APPLY_DELETES_OPTIONS, TableRef
from runstate.maintenance.options import ActionSettings
from runstate_tests.support.lake import append_randomly, assert_lake_equals_feed, exported_to_the_end


@pytest.mark.spark
def test_every_maintenance_action_runs_on_both_history_tables_and_applies_the_runs_deletes(
    spark, own_store, history
):
    """runs is merged on read, and has list and map columns (failed_steps, steps), whose position deletes
    Iceberg 1.10's rewrite_position_delete_files cannot read: the job the orchestrator gives a table with
    delete files (every action, deletes applied) succeeds, though an export merged after its data-file
    rewrite, leaves no delete file and changes no row."""
    rng = random.Random(11)
    for _ in range(3):  # three merges: the later ones update runs of the earlier ones (position deletes)
        append_randomly(own_store, rng, runs=5, appends=8)
        exported_to_the_end(spark, own_store, history)
    runs = TableRef(history.namespace, "runs")
    assert spark.table(f"lake.{runs.quoted}.delete_files").count() > 0

    for table in ("run_events", "runs"):
        runner = ActionRunner(
            spark, TableRef(history.namespace, table), ActionSettings(**APPLY_DELETES_OPTIONS)
        )
        for action in ACTIONS:
            if action == "rewrite_position_delete_files":  # an export merges while the job runs
                append_randomly(own_store, rng, runs=5, appends=4)
                exported_to_the_end(spark, own_store, history)
            result = runner.run(action)
            assert result.success, result.error

    assert spark.table(f"lake.{runs.quoted}.delete_files").count() == 0
    assert_lake_equals_feed(spark, own_store, history)
