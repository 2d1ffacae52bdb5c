"""The Dagster side of the dataset tables: the sensor's shard runs, the merge job, the rebuild asset,
the CLI."""

from __future__ import annotations

import json
from collections.abc import Iterator

import dagster as dg
import pytest
from click.testing import CliRunner

from runstate.cli import main
from runstate.commands.ticking import tick_sensor
from runstate.defs import dataset_tables as dataset_tables_defs
from runstate.defs.dataset_tables.jobs import COMMITTED_EARLIER, MERGE_JOB, MERGE_OP
from runstate.defs.dataset_tables.sensors import MERGE_SHARDS, MergeCursor, evaluate_merge_tick
from runstate.defs.spark import SparkResource
from runstate.defs.tags import MERGE_SHARD_TAG
from runstate.defs.wal import build_defs as wal_defs
from runstate.defs.wal.partitions import datasets_partitions
from runstate.defs.wal.resources import WalResource
from runstate.wal.changes import Change
from runstate.wal.dataset_tables import merge_dataset, read_table
from runstate.wal.shards import shard_of
from runstate_tests.support.wal import cli_on

pytestmark = pytest.mark.spark
SENSOR = "dataset_tables_sensor"


@pytest.fixture
def resource(wal) -> WalResource:
    return WalResource(
        endpoint_url=wal.endpoint,
        region="us-east-1",
        table=wal.table,
        bucket=wal.bucket,
        prefix=wal.prefix,
        flush_linger_s=0,
    )


@pytest.fixture
def defs(resource, spark_settings) -> dg.Definitions:
    shared = dg.Definitions(resources={"spark": SparkResource.from_settings(spark_settings)})
    return dg.Definitions.merge(shared, wal_defs(wal=resource), dataset_tables_defs.build_defs())


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as instance:
        yield instance


def _flushed(feed, dataset_ids, n: int = 1) -> None:
    for dataset_id in dataset_ids:
        for i in range(n):
            feed.append(dataset_id, [Change.upsert(f"k{i}", i), Change.upsert("last", dataset_id)])
        feed.flush(dataset_id)


def test_a_tick_requests_one_run_per_shard_and_each_table_reaches_its_version(
    spark, feed, defs, instance, dataset_ids
):
    ids = [dataset_ids() for _ in range(6)]
    _flushed(feed, ids)
    instance.add_dynamic_partitions(datasets_partitions.name, ids)

    result = tick_sensor(SENSOR, defs=defs, instance=instance)

    shards = {shard_of(d, MERGE_SHARDS) for d in ids}
    assert result.requested == len(shards) <= MERGE_SHARDS and result.failed == 0
    assert {run.dagster_run.tags[MERGE_SHARD_TAG] for run in result.results} == {str(s) for s in shards}
    for dataset_id in ids:
        assert read_table(spark, dataset_id) == feed.reader(dataset_id).read()
    event = instance.get_latest_materialization_event(dg.AssetKey("dataset_tables"))
    assert event.asset_materialization.metadata["version"].value >= 1
    again = tick_sensor(SENSOR, defs=defs, instance=instance)
    assert again.requested == 0 and "every dataset table is at its dataset's version" in again.skip_reason


def test_a_failed_merge_run_is_requested_again_once_it_is_dead(spark, wal, feed, defs, instance, dataset_ids):
    dataset_id = dataset_ids()
    _flushed(feed, [dataset_id])
    delta = feed.reader(dataset_id).manifest().deltas[-1].key
    good = wal.s3.get_object(Bucket=wal.bucket, Key=delta)["Body"].read()
    wal.s3.put_object(Bucket=wal.bucket, Key=delta, Body=b"corrupt")

    failed = tick_sensor(SENSOR, defs=defs, instance=instance)
    wal.s3.put_object(Bucket=wal.bucket, Key=delta, Body=good)
    retried = tick_sensor(SENSOR, defs=defs, instance=instance)

    assert (failed.requested, failed.failed) == (1, 1)
    assert (retried.requested, retried.succeeded) == (1, 1)
    assert read_table(spark, dataset_id) == feed.reader(dataset_id).read()


def test_a_shard_with_a_live_run_is_held(wal, feed, defs, instance, resource, dataset_ids):
    dataset_id = dataset_ids()
    _flushed(feed, [dataset_id])
    shard = shard_of(dataset_id, MERGE_SHARDS)
    instance.create_run_for_job(
        defs.resolve_job_def("merge_dataset_tables"),
        tags={MERGE_SHARD_TAG: str(shard)},
        run_config={"ops": {"merge_datasets": {"config": {"dataset_ids": []}}}},
    )

    plan = evaluate_merge_tick(instance, MergeCursor(), resource)

    assert plan.requests == [] and plan.held_shards == [shard]
    assert dataset_id not in plan.cursor.requested  # still due once the shard is free


def test_materializing_partitions_rebuilds_their_tables_in_one_run(spark, feed, defs, instance, dataset_ids):
    ids = sorted(dataset_ids() for _ in range(2))
    _flushed(feed, ids, n=2)
    instance.add_dynamic_partitions(datasets_partitions.name, ids)
    job = defs.resolve_implicit_global_asset_job_def().get_subset(
        asset_selection={dg.AssetKey("dataset_tables")}
    )

    result = job.execute_in_process(
        instance=instance,
        tags={"dagster/asset_partition_range_start": ids[0], "dagster/asset_partition_range_end": ids[1]},
    )

    assert result.success
    materializations = result.asset_materializations_for_node("dataset_tables")
    assert sorted(m.partition for m in materializations) == ids  # one per partition, in one run
    versions = {d: feed.reader(d).version for d in ids}
    assert all(m.metadata["versions"].value == versions for m in materializations)
    for dataset_id in ids:
        assert read_table(spark, dataset_id) == feed.reader(dataset_id).read()


@pytest.fixture
def cli(wal, spark_settings, dagster_home, monkeypatch) -> Iterator[CliRunner]:
    """The CLI on the test's WAL and on the same catalog and warehouse as the shared Spark session."""
    yield from cli_on(monkeypatch, wal, spark_settings)


def test_wal_merge_and_read_with_spark_print_the_blob_readers_json(spark, cli, feed, dataset_ids):
    dataset_id = dataset_ids()
    _flushed(feed, [dataset_id], n=3)

    merged = cli.invoke(main, ["wal", "merge", "--dataset", dataset_id])
    blobs = cli.invoke(main, ["wal", "read", "--dataset", dataset_id])
    table = cli.invoke(main, ["wal", "read", "--dataset", dataset_id, "--engine", "spark"])

    assert merged.exit_code == 0, merged.output
    assert f"{dataset_id}: lake.datasets.{dataset_id} at version 3" in merged.output
    assert table.exit_code == 0 and json.loads(table.output) == json.loads(blobs.output)


def test_reading_a_dataset_that_was_never_merged_is_one_clear_error(spark, cli, dataset_ids):
    result = cli.invoke(main, ["wal", "read", "--dataset", dataset_ids(), "--engine", "spark"])

    assert result.exit_code == 1
    assert "does not exist; run `runstate wal merge` first" in result.output


def test_a_dataset_whose_version_went_back_is_requested_not_reported_current(
    wal, feed, instance, resource, dataset_ids
):
    dataset_id = dataset_ids()
    _flushed(feed, [dataset_id])  # version 1, where the cursor remembers 11 (the WAL started over)

    plan = evaluate_merge_tick(instance, MergeCursor({dataset_id: 11}), resource)

    assert [
        request.run_config["ops"]["merge_datasets"]["config"]["dataset_ids"] for request in plan.requests
    ] == [[dataset_id]]


def test_wal_merge_prints_every_dataset_it_merged_even_those_already_current(spark, cli, feed, dataset_ids):
    behind, current = sorted(dataset_ids() for _ in range(2))
    _flushed(feed, [behind, current])
    by_name = cli.invoke(main, ["wal", "merge", "--dataset", current])  # the sensor's cursor does not know

    merged = cli.invoke(main, ["wal", "merge"])

    assert by_name.exit_code == 0 and merged.exit_code == 0, merged.output
    assert f"{behind}: lake.datasets.{behind} at version 1\n" in merged.output
    assert f"{current}: lake.datasets.{current} at version 1 (already current)" in merged.output


def test_wal_merge_rebuild_with_a_missing_blob_names_the_blob(spark, wal, cli, feed, dataset_ids):
    dataset_id = dataset_ids()
    _flushed(feed, [dataset_id])
    delta = feed.reader(dataset_id).manifest().deltas[-1].key
    wal.s3.delete_object(Bucket=wal.bucket, Key=delta)

    result = cli.invoke(main, ["wal", "merge", "--dataset", dataset_id, "--rebuild"])

    last_line = result.output.strip().splitlines()[-1]  # Dagster's own log lines come before it
    assert result.exit_code == 1
    assert f"blob {delta} is missing" in last_line and "max_retries" not in last_line


def test_wal_merge_of_an_unknown_dataset_is_refused_and_makes_no_table(spark, cli, dataset_ids):
    dataset_id = dataset_ids("nosuch")

    result = cli.invoke(main, ["wal", "merge", "--dataset", dataset_id])

    assert result.exit_code == 1
    assert result.output.strip() == f"Error: dataset {dataset_id!r} is unknown: it has no WAL rows"
    assert not spark.catalog.tableExists(f"lake.datasets.{dataset_id}")


def test_a_merge_committed_by_a_run_killed_before_it_recorded_it_is_recorded_by_the_next_merge(
    spark, wal, location, feed, defs, instance, dataset_ids
):
    """The killed run's MERGE committed (and its version property), but no materialization was stored:
    the next merge finds the table current, and records the partition materialized, saying by whom."""
    dataset_id = dataset_ids()
    _flushed(feed, [dataset_id])
    instance.add_dynamic_partitions(datasets_partitions.name, [dataset_id])
    assert merge_dataset(spark, location, dataset_id, s3=wal.s3).merged  # the killed run's commit
    job = defs.resolve_job_def(MERGE_JOB)
    config = {"ops": {MERGE_OP: {"config": {"dataset_ids": [dataset_id]}}}}

    first = job.execute_in_process(instance=instance, run_config=config)
    again = job.execute_in_process(instance=instance, run_config=config)

    [recorded] = first.asset_materializations_for_node(MERGE_OP)
    assert recorded.partition == dataset_id and recorded.metadata["version"].value == 1
    assert recorded.metadata["committed_by"].value == COMMITTED_EARLIER
    assert first.asset_observations_for_node(MERGE_OP) == []
    assert instance.get_materialized_partitions(dg.AssetKey("dataset_tables")) == {dataset_id}
    # Once recorded, a table found current again is an observation, as before.
    assert again.asset_materializations_for_node(MERGE_OP) == []
    assert [o.partition for o in again.asset_observations_for_node(MERGE_OP)] == [dataset_id]
