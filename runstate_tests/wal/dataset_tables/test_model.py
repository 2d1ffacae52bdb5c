"""THE MODEL CHECK of the dataset tables: a random workload flushed through the real WAL, with merges
repeated, merges retried out of order (stale plans applied after newer merges), compactions between
merges, and merge processes SIGKILLed in the middle of their MERGE (their driver and JVM together).

After every kill the table is at a whole version (its live rows are the fold at the version its
`#version` row names); at the end every table's live rows equal DatasetReader's state at the same
version and the plain fold of every change. Scale with RUNSTATE_LAKE_MODEL_ROUNDS and _SEED.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from runstate.wal import compact
from runstate.wal.changes import Change
from runstate.wal.dataset_tables import merge_dataset, read_table, table_ident
from runstate.wal.dataset_tables.merge import apply_plan
from runstate.wal.dataset_tables.source import plan_merge
from runstate.wal.dataset_tables.table import ensure_table, marker_version

from .killing import MergeChild, StallingProxy

# The default seed's 4 rounds hold every event the model is about: 2 kills (each of a dataset whose table
# exists), 2 compactions, 3 stale plans applied late (2 of them rebuilds) and merges repeated at once.
# Each round costs tens of seconds of Spark; another seed may need more rounds for the same events.
ROUNDS = int(os.environ.get("RUNSTATE_LAKE_MODEL_ROUNDS", "4"))
SEED = int(os.environ.get("RUNSTATE_LAKE_MODEL_SEED", "20261162"))

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _random_changes(rng: random.Random) -> list[Change]:
    changes = []
    for _ in range(rng.randint(1, 6)):
        key = rng.choice([rng.randint(0, 12), f"k{rng.randint(0, 12)}"])
        if rng.random() < 0.25:
            changes.append(Change.delete(key))
        else:
            changes.append(
                Change.upsert(
                    key,
                    rng.choice([rng.randint(-9, 9), f"v{rng.random():.4f}", {"n": rng.randint(0, 3)}, None]),
                )
            )
    return changes


def _assert_whole_version(spark, feed, dataset_id: str) -> int:
    """The table holds exactly the fold at the version its `#version` row names: nothing half-applied."""
    version = marker_version(spark, table_ident(dataset_id))
    assert read_table(spark, dataset_id)[1] == feed.fold(dataset_id, version)
    return version


def _kill_mid_merge(
    spark, wal, feed, spark_settings, dataset_id: str, rng: random.Random, stall: bool
) -> None:
    """A child merges through a proxy that stalls its first delta read (the MERGE is running): kill it then
    (stall), or after a random delay, wherever it has got to."""
    proxy = StallingProxy(wal.endpoint)
    try:
        if stall:
            proxy.armed.set()
        feed.append(dataset_id, _random_changes(rng))  # something to merge, so the child reads a delta
        feed.flush(dataset_id)
        before = marker_version(spark, table_ident(dataset_id))
        child = MergeChild(
            {
                "pg_url": spark_settings.pg_url,
                "warehouse": str(spark_settings.warehouse_dir),
                "bucket": wal.bucket,
                "prefix": wal.prefix,
                "endpoint": proxy.endpoint,
                "dataset_id": dataset_id,
            }
        )
        child.wait_for("MERGING")
        if stall:
            assert proxy.stalled.wait(300), "the child's MERGE never read a delta"
        else:
            time.sleep(rng.uniform(0.0, 4.0))  # any moment is a valid kill point; the assertions hold for all
        child.kill()
    finally:
        proxy.close()
    after = _assert_whole_version(spark, feed, dataset_id)
    if stall:
        assert after == before  # killed before its commit: the table is as it was


@pytest.mark.timeout(1800)
def test_tables_equal_the_reader_and_the_fold_after_kills_repeats_and_stale_retries(
    spark, wal, feed, location, dataset_ids, spark_settings
):
    rng = random.Random(SEED)
    ids = [dataset_ids("m") for _ in range(3)]
    stale: list[tuple[str, object]] = []
    kills = 0
    for round_ in range(ROUNDS):
        for dataset_id in ids:
            for _ in range(rng.randint(1, 4)):
                feed.append(dataset_id, _random_changes(rng))
            if rng.random() < 0.8:
                feed.flush(dataset_id)
        dataset_id = rng.choice(ids)
        stale.append((dataset_id, feed.reader(dataset_id).manifest()))
        if rng.random() < 0.3:
            compact(*wal.owners(), dataset_id, retention_days=30)
        if round_ % 2 == 1 and kills < 2:  # rounds 1 and 3
            _kill_mid_merge(spark, wal, feed, spark_settings, dataset_id, rng, stall=kills == 0)
            kills += 1
        for _ in range(rng.randint(1, 2)):  # a merge, sometimes repeated at once
            merge_dataset(spark, location, rng.choice(ids))
        if stale and rng.random() < 0.6:  # a retry that arrives late: an old plan applied now
            old_id, manifest = stale.pop(rng.randrange(len(stale)))
            ident = ensure_table(spark, old_id)
            apply_plan(spark, location, ident, plan_merge(manifest, 0, rebuild=rng.random() < 0.5))
        for dataset_id in ids:
            if spark.catalog.tableExists(table_ident(dataset_id)):
                _assert_whole_version(spark, feed, dataset_id)

    assert kills == 2
    for dataset_id in ids:
        feed.flush(dataset_id)
        merge_dataset(spark, location, dataset_id)
        version, state = feed.reader(dataset_id).read()
        assert read_table(spark, dataset_id) == (version, state)
        assert state == feed.fold(dataset_id, version)
