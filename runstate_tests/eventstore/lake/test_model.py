"""THE MODEL CHECK of the run history: random appends on 50 runs, exports SIGKILLed at random points
(their driver and JVM together) and exports repeated. After every round `run_events` equals the feed
from position 0, row for row, and `runs` equals the aggregate of the feed and the store's projection.

The first kill lands right after an export's first commit to run_events, before its runs merge (the
seam between the two commits); the others after a random delay into the export, wherever that is
(reading the feed, inside a commit, between commits, in a merge, or after the end). Scale with
RUNSTATE_HISTORY_MODEL_ROUNDS and _SEED.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from runstate.eventstore.lake import export_history
from runstate.eventstore.lake.tables import events_position, runs_position
from runstate_tests.support import lake as helpers

from .export_child import ExportChild

ROUNDS = int(os.environ.get("RUNSTATE_HISTORY_MODEL_ROUNDS", "3"))
SEED = int(os.environ.get("RUNSTATE_HISTORY_MODEL_SEED", "20261128"))
RUNS = 50

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _killed_export(child_args: dict, hold_after: str | None, delay_s: float) -> None:
    """Start an export in a child process and SIGKILL it: after its first `hold_after` step, or `delay_s`
    into the export."""
    child = ExportChild({**child_args, "hold_after": hold_after})
    try:
        child.wait_for("EXPORTING")
        if hold_after:
            child.wait_for(hold_after)
        else:
            time.sleep(delay_s)
    finally:
        child.kill()


def test_killed_and_repeated_exports_leave_the_lake_equal_to_the_feed(
    spark, spark_settings, migrated_database, own_store, history
):
    rng = random.Random(SEED)
    child_args = {
        "catalog_url": spark_settings.pg_url,
        "warehouse": str(spark_settings.warehouse_dir),
        "store_url": migrated_database,
        "schema": own_store.schema,
        "namespace": history.namespace,
        "batch_events": helpers.SMALL_BATCHES,  # so kills land between commits
    }
    for round_ in range(ROUNDS):
        helpers.append_randomly(own_store, rng, RUNS, appends=rng.randint(30, 60))
        hold_after = "EventsCommitted" if round_ == 0 else None
        _killed_export(child_args, hold_after, delay_s=rng.uniform(0.5, 6.0))
        if hold_after:  # the kill fell between the two commits: runs is behind run_events
            assert 0 < len(helpers.lake_events(spark, history)) < len(helpers.feed_from_start(own_store))
            assert runs_position(spark, history) < events_position(spark, history)[1]

        helpers.exported_to_the_end(spark, own_store, history)
        repeated = list(export_history(spark, own_store, history))

        assert repeated == [], f"round {round_}: a repeated export wrote {repeated}"
        helpers.assert_lake_equals_feed(spark, own_store, history)
