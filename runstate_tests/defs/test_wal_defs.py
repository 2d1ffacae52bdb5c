"""The WAL domain's Dagster pieces one by one: resource, retry policy, sensor cursor and bad input,
dataset_snapshots backfill, wal_lag check, compaction schedule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest

from runstate.commands.ticking import CURSOR_KEY, tick_schedule, tick_sensor
from runstate.config import settings
from runstate.defs.resources import wal_resource
from runstate.defs.tags import WAL_BATCH_TAG, WAL_SHARD_TAG
from runstate.defs.wal import defs as wal_defs
from runstate.defs.wal.assets import dataset_snapshots
from runstate.defs.wal.jobs import FLUSH_RETRY_POLICY, MAX_RETRY_WAIT_S, flush_retry_policy
from runstate.defs.wal.resources import WalResource
from runstate.wal import BlobIntegrityError, Change, DatasetReader
from runstate.wal.changes import fold
from runstate.wal.shards import shard_of
from runstate_tests.wal.shell import WalWorld


def test_the_code_location_loads_with_every_wal_definition() -> None:
    assert wal_defs.resolve_job_def("flush_wal") and wal_defs.resolve_job_def("compact_wal")
    assert wal_defs.resolve_sensor_def("wal_sensor").minimum_interval_seconds == 5
    assert wal_defs.resolve_schedule_def("wal_compaction_schedule").cron_schedule == "10 3 * * *"
    assert wal_defs.resolve_assets_def("dataset_snapshots").partitions_def.name == "datasets"


def test_flush_retry_policy_is_exponential_and_never_waits_more_than_five_minutes() -> None:
    policy = FLUSH_RETRY_POLICY
    op = wal_defs.resolve_job_def("flush_wal").graph.node_named("flush_wal_shard").definition
    worst = [((2**n) - 1) * policy.delay + policy.delay for n in range(1, policy.max_retries + 1)]

    assert op.retry_policy == policy and policy.backoff == dg.Backoff.EXPONENTIAL and policy.jitter
    assert max(worst) <= MAX_RETRY_WAIT_S and policy.max_retries >= 5
    with pytest.raises(ValueError, match="300 s"):
        flush_retry_policy(max_retries=8, delay=2.0)


def test_the_built_resource_follows_the_settings_and_clients_open_lazily(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RUNSTATE_WAL_TABLE", "wal_from_env")
    monkeypatch.setenv("RUNSTATE_BLOB_BUCKET", "bucket-from-env")
    monkeypatch.setenv("RUNSTATE_AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("RUNSTATE_WAL_FLUSH_SHARDS", "3")
    settings.cache_clear()
    try:
        resource = wal_resource()
        assert (resource.table, resource.bucket, resource.endpoint_url, resource.flush_shards) == (
            "wal_from_env",
            "bucket-from-env",
            "http://127.0.0.1:1",
            3,
        )
        assert resource._clients == {}  # nothing opened by building or reading config
        assert wal_resource(table="explicit").table == "explicit"
    finally:
        settings.cache_clear()


def test_the_resource_itself_never_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNSTATE_WAL_TABLE", "wal_from_env")
    settings.cache_clear()
    try:
        resource = WalResource()
    finally:
        settings.cache_clear()

    assert (resource.table, resource.bucket, resource.prefix) == (
        "runstate_wal",
        "runstate-blobs",
        "datasets/",
    )


def test_run_requests_carry_shard_tag_plan_tag_and_a_deterministic_run_key(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    for i in range(3):
        world.append("orders", f"k{i}", i)
    world.append("users", "u", 1)
    sensor = wal_defs.resolve_sensor_def("wal_sensor")
    resources = {"wal": world.resource(flush_shards=1)}

    def evaluate() -> list[dg.RunRequest]:
        with dg.build_sensor_context(instance=instance, resources=resources) as ctx:
            return list(sensor.evaluate_tick(ctx).run_requests)

    first, second = evaluate(), evaluate()

    assert [r.run_key for r in first] == [r.run_key for r in second]  # same input, same keys
    [request] = first  # one shard: one run for both datasets
    assert request.tags[WAL_SHARD_TAG] == "0"
    assert request.run_key.startswith(request.tags[WAL_BATCH_TAG]) and request.run_key.endswith("-g0")
    assert request.run_config["ops"]["flush_wal_shard"]["config"] == {
        "shard": 0,
        "batches": [{"dataset_id": "orders", "seqs": [1, 2, 3]}, {"dataset_id": "users", "seqs": [1]}],
    }


def test_an_unreadable_cursor_loses_nothing(world: WalWorld, instance: dg.DagsterInstance) -> None:
    world.append("orders", "a", 1)
    instance.run_storage.set_cursor_values({CURSOR_KEY.format("wal_sensor"): "{not json"})

    tick = tick_sensor("wal_sensor", defs=world.defs(), instance=instance)

    assert (tick.requested, tick.succeeded) == (1, 1)
    assert DatasetReader(world.s3, world.bucket, world.prefix, "orders").read() == (1, {"a": 1})


@pytest.mark.parametrize(
    "batch, message",
    [
        ({"dataset_id": "../etc", "seqs": [1]}, "dataset id '../etc' is invalid"),
        ({"dataset_id": "orders\n", "seqs": [1]}, "dataset id 'orders\\n' is invalid"),
        ({"dataset_id": "orders", "seqs": []}, "at least one seq"),
        ({"dataset_id": "orders", "seqs": [0]}, "not a positive integer"),
        ({"dataset_id": "orders", "seqs": [5]}, "seq 2 is missing"),
    ],
)
def test_a_bad_planned_batch_is_reported_with_a_clear_error_and_writes_nothing(
    world: WalWorld, instance: dg.DagsterInstance, batch: dict, message: str
) -> None:
    world.append("orders", "a", 1)
    job = world.defs().resolve_job_def("flush_wal")
    run_config = {"ops": {"flush_wal_shard": {"config": {"shard": 0, "batches": [batch]}}}}

    result = job.execute_in_process(run_config=run_config, instance=instance, raise_on_error=False)

    [output] = [e for e in result.all_node_events if e.event_type == dg.DagsterEventType.STEP_OUTPUT]
    failures = output.step_output_data.metadata["failures"].value
    assert list(failures) == [batch["dataset_id"]] and message in failures[batch["dataset_id"]]
    assert world.blob_keys("orders") == [] and set(world.statuses("orders").values()) == {"Pending"}


def test_one_failing_dataset_fails_neither_the_others_of_its_shard_nor_the_run(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    good = "orders"
    bad = next(f"bad{i}" for i in range(100) if shard_of(f"bad{i}", 2) == shard_of(good, 2))
    world.append(good, "a", 1)
    world.append(bad, "b", 2)
    # Corrupt the bad dataset's row: its checksum no longer matches (a flush refuses it, every time).
    world.dynamodb.update_item(
        TableName=world.table,
        Key={"DatasetId": {"S": bad}, "SeqNo": {"N": "1"}},
        UpdateExpression="SET Payload = :p",
        ExpressionAttributeValues={":p": {"S": '[["upsert","b",3]]'}},
    )
    defs = world.defs()

    tick = tick_sensor("wal_sensor", defs=defs, instance=instance)
    again = tick_sensor("wal_sensor", defs=defs, instance=instance)

    assert (tick.requested, tick.succeeded) == (1, 1)
    [output] = [e for e in tick.results[0].all_node_events if e.event_type == dg.DagsterEventType.STEP_OUTPUT]
    metadata = {k: v.value for k, v in output.step_output_data.metadata.items()}
    assert (metadata["flushed"], metadata["failed"]) == (1, 1) and "checksum mismatch" in metadata[
        "failures"
    ][bad]
    assert DatasetReader(world.s3, world.bucket, world.prefix, good).read() == (1, {"a": 1})
    assert DatasetReader(world.s3, world.bucket, world.prefix, bad).read() == (0, {})
    materialized = {m.partition for m in tick.results[0].asset_materializations_for_node("flush_wal_shard")}
    assert materialized == {good}
    assert again.requested == 1  # the bad dataset is planned again by the next tick


def test_one_tick_requests_at_most_one_run_per_shard_and_every_partition_is_materialized(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    datasets = [f"ds{i:02d}" for i in range(12)]
    for ds in datasets:
        world.append(ds, "k", ds)

    tick = tick_sensor("wal_sensor", defs=world.defs(world.resource(flush_shards=3)), instance=instance)

    shards = sorted(run.dagster_run.tags[WAL_SHARD_TAG] for run in tick.results)
    assert shards == sorted({str(shard_of(ds, 3)) for ds in datasets}) and len(shards) <= 3
    assert tick.succeeded == tick.requested
    materialized = [
        m.partition for r in tick.results for m in r.asset_materializations_for_node("flush_wal_shard")
    ]
    assert sorted(materialized) == datasets
    assert sorted(instance.get_dynamic_partitions("datasets")) == datasets
    for ds in datasets:
        assert DatasetReader(world.s3, world.bucket, world.prefix, ds).read() == (1, {"k": ds})


def test_a_shard_flushed_less_than_the_run_interval_ago_waits(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    defs = world.defs(world.resource(min_run_interval_s=3600))
    world.append("orders", "a", 1)
    first = tick_sensor("wal_sensor", defs=defs, instance=instance)
    world.append("orders", "b", 2)

    second = tick_sensor("wal_sensor", defs=defs, instance=instance)

    assert first.requested == 1 and second.requested == 0 and "run interval" in second.skip_reason
    assert DatasetReader(world.s3, world.bucket, world.prefix, "orders").version == 1


def test_backfill_of_dataset_snapshots_rebuilds_every_dataset_from_its_wal(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    changes = {
        ds: [Change.upsert(f"{ds}-{i}", i) for i in range(4)] + [Change.delete(f"{ds}-0")]
        for ds in ("orders", "users")
    }
    for ds, items in changes.items():
        for change in items:
            world.producer().append(ds, [change])
    tick_sensor("wal_sensor", defs=world.defs(), instance=instance)
    # Break one dataset's delta blob: only a rebuild from the WAL can repair it.
    [delta] = world.blob_keys("orders")
    world.s3.put_object(Bucket=world.bucket, Key=delta, Body=b"garbage")
    with pytest.raises(BlobIntegrityError, match="checksum mismatch"):
        DatasetReader(world.s3, world.bucket, world.prefix, "orders").state()

    for ds in instance.get_dynamic_partitions("datasets"):
        result = dg.materialize(
            [dataset_snapshots], partition_key=ds, resources={"wal": world.resource()}, instance=instance
        )
        assert result.success

    for ds, items in changes.items():
        reader = DatasetReader(world.s3, world.bucket, world.prefix, ds)
        assert reader.read() == (5, fold({}, items))
        assert reader.manifest().snapshot is not None


def _run_lag_check(world: WalWorld, instance: dg.DagsterInstance) -> dg.AssetCheckEvaluation:
    result = world.defs().resolve_job_def("wal_lag_check").execute_in_process(instance=instance)
    [evaluation] = result.get_asset_check_evaluations()
    return evaluation


def test_wal_lag_check_fails_when_the_oldest_pending_row_is_older_than_an_hour(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    two_hours_ago = datetime.now(UTC) - timedelta(hours=2)
    world.producer().append("orders", [Change.upsert("a", 1)], now=two_hours_ago)

    evaluation = _run_lag_check(world, instance)

    assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR
    assert evaluation.metadata["oldest_pending_age_s"].value >= 7000


def test_wal_lag_check_passes_when_pending_rows_are_fresh_or_none(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    assert _run_lag_check(world, instance).passed
    world.append("orders", "a", 1)
    assert _run_lag_check(world, instance).passed


def test_compaction_schedule_requests_one_run_per_shard_and_keeps_reader_state(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    changes = {
        ds: [Change.upsert(f"k{i}", i) for i in range(3)] for ds in ("orders", "users", "items", "carts")
    }
    for ds, items in changes.items():
        for change in items:
            world.producer().append(ds, [change])
    defs = world.defs()
    tick_sensor("wal_sensor", defs=defs, instance=instance)
    at = datetime(2026, 1, 2, 3, 0, tzinfo=UTC)

    tick = tick_schedule("wal_compaction_schedule", defs=defs, instance=instance, at=at)
    again = tick_schedule("wal_compaction_schedule", defs=defs, instance=instance, at=at)

    shards = sorted({str(shard_of(ds, 2)) for ds in changes})
    assert (tick.requested, tick.succeeded) == (len(shards), len(shards))
    assert sorted(r.dagster_run.tags[WAL_SHARD_TAG] for r in tick.results) == shards
    assert len(again.skipped_run_keys) == len(shards)  # one compaction per shard per day
    for ds, items in changes.items():
        reader = DatasetReader(world.s3, world.bucket, world.prefix, ds)
        assert reader.read() == (3, fold({}, items)) and reader.manifest().snapshot is not None


def test_a_fresh_instance_learns_every_dataset_partition_even_with_nothing_pending(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    world.append("orders", "a", 1)
    tick_sensor("wal_sensor", defs=world.defs(), instance=instance)

    with dg.DagsterInstance.ephemeral() as fresh:
        tick = tick_sensor("wal_sensor", defs=world.defs(), instance=fresh)
        assert tick.requested == 0 and fresh.get_dynamic_partitions("datasets") == ["orders"]
