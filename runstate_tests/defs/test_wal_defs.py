"""The WAL domain's Dagster pieces one by one: resource, retry policy, sensor cursor and bad input,
dataset_snapshots backfill, wal_lag check, compaction schedule."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import dagster as dg
import pytest

from runstate.config import settings
from runstate.defs.ticking import CURSOR_KEY, tick_schedule, tick_sensor
from runstate.defs.wal import defs as wal_defs
from runstate.defs.wal.assets import dataset_snapshots
from runstate.defs.wal.jobs import FLUSH_RETRY_POLICY, MAX_RETRY_WAIT_S, flush_retry_policy
from runstate.defs.wal.partitions import BATCH_TAG, DATASET_TAG
from runstate.defs.wal.resources import WalResource
from runstate.wal import BlobIntegrityError, Change, DatasetReader
from runstate.wal.changes import fold

from wal_fixtures import WalWorld, instance, world  # noqa: F401


def test_the_code_location_loads_with_every_wal_definition() -> None:
    assert wal_defs.resolve_job_def("flush_wal") and wal_defs.resolve_job_def("compact_wal")
    assert wal_defs.resolve_sensor_def("wal_sensor").minimum_interval_seconds == 30
    assert wal_defs.resolve_schedule_def("wal_compaction_schedule").cron_schedule == "0 3 * * *"
    assert wal_defs.resolve_assets_def("dataset_snapshots").partitions_def.name == "datasets"


def test_flush_retry_policy_is_exponential_and_never_waits_more_than_five_minutes() -> None:
    policy = FLUSH_RETRY_POLICY
    op = wal_defs.resolve_job_def("flush_wal").graph.node_named("flush_wal_batch").definition
    worst = [((2**n) - 1) * policy.delay + policy.delay for n in range(1, policy.max_retries + 1)]

    assert op.retry_policy == policy and policy.backoff == dg.Backoff.EXPONENTIAL and policy.jitter
    assert max(worst) <= MAX_RETRY_WAIT_S and policy.max_retries >= 5
    with pytest.raises(ValueError, match="300 s"):
        flush_retry_policy(max_retries=8, delay=2.0)


def test_resource_defaults_follow_the_settings_and_clients_open_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNSTATE_WAL_TABLE", "wal_from_env")
    monkeypatch.setenv("RUNSTATE_BLOB_BUCKET", "bucket-from-env")
    monkeypatch.setenv("RUNSTATE_AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    settings.cache_clear()
    try:
        resource = WalResource()
        assert (resource.table_name, resource.bucket_name, resource.resolved_endpoint_url) == (
            "wal_from_env", "bucket-from-env", "http://127.0.0.1:1",
        )
        assert resource._clients == {}  # nothing opened by building or reading config
        assert WalResource(table="explicit").table_name == "explicit"
    finally:
        settings.cache_clear()


def test_run_requests_carry_dataset_tag_batch_tag_and_a_deterministic_run_key(world: WalWorld, instance: dg.DagsterInstance) -> None:
    for i in range(3):
        world.append("orders", f"k{i}", i)
    world.append("users", "u", 1)
    sensor = wal_defs.resolve_sensor_def("wal_sensor")
    resources = {"wal": world.resource()}

    def evaluate() -> list[dg.RunRequest]:
        with dg.build_sensor_context(instance=instance, resources=resources) as ctx:
            return list(sensor.evaluate_tick(ctx).run_requests)

    first, second = evaluate(), evaluate()

    assert [r.run_key for r in first] == [r.run_key for r in second]  # same input, same keys
    assert [r.tags[DATASET_TAG] for r in first] == ["orders", "users"]
    assert all(r.run_key.startswith(r.tags[BATCH_TAG]) and r.run_key.endswith("-g0") for r in first)
    assert first[0].run_config["ops"]["flush_wal_batch"]["config"] == {"dataset_id": "orders", "seqs": [1, 2, 3]}


def test_an_unreadable_cursor_loses_nothing(world: WalWorld, instance: dg.DagsterInstance) -> None:
    world.append("orders", "a", 1)
    instance.run_storage.set_cursor_values({CURSOR_KEY.format("wal_sensor"): "{not json"})

    tick = tick_sensor("wal_sensor", defs=world.defs(), instance=instance)

    assert (tick.requested, tick.succeeded) == (1, 1)
    assert DatasetReader(world.s3, world.bucket, world.prefix, "orders").read() == (1, {"a": 1})


@pytest.mark.parametrize(
    "config, message",
    [
        ({"dataset_id": "../etc", "seqs": [1]}, "dataset id '../etc' is invalid"),
        ({"dataset_id": "orders", "seqs": []}, "at least one seq"),
        ({"dataset_id": "orders", "seqs": [0]}, "not a positive integer"),
        ({"dataset_id": "orders", "seqs": [5]}, "seq 2 is missing"),
    ],
)
def test_bad_flush_config_fails_the_run_with_a_clear_error_and_writes_nothing(
    world: WalWorld, instance: dg.DagsterInstance, config: dict, message: str
) -> None:
    world.append("orders", "a", 1)
    job = world.defs().resolve_job_def("flush_wal")

    result = job.execute_in_process(
        run_config={"ops": {"flush_wal_batch": {"config": config}}}, instance=instance, raise_on_error=False
    )

    assert not result.success
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE)
    assert message in str(failure.step_failure_data.error)
    assert world.blob_keys("orders") == [] and set(world.statuses("orders").values()) == {"Pending"}


def test_backfill_of_dataset_snapshots_rebuilds_every_dataset_from_its_wal(world: WalWorld, instance: dg.DagsterInstance) -> None:
    changes = {ds: [Change.upsert(f"{ds}-{i}", i) for i in range(4)] + [Change.delete(f"{ds}-0")] for ds in ("orders", "users")}
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
        result = dg.materialize([dataset_snapshots], partition_key=ds, resources={"wal": world.resource()}, instance=instance)
        assert result.success

    for ds, items in changes.items():
        reader = DatasetReader(world.s3, world.bucket, world.prefix, ds)
        assert reader.read() == (5, fold({}, items))
        assert reader.manifest().snapshot is not None


def _run_lag_check(world: WalWorld, instance: dg.DagsterInstance) -> dg.AssetCheckEvaluation:
    result = world.defs().resolve_job_def("wal_lag_check").execute_in_process(instance=instance)
    [evaluation] = result.get_asset_check_evaluations()
    return evaluation


def test_wal_lag_check_fails_when_the_oldest_pending_row_is_older_than_an_hour(world: WalWorld, instance: dg.DagsterInstance) -> None:
    two_hours_ago = datetime.now(timezone.utc) - timedelta(hours=2)
    world.producer().append("orders", [Change.upsert("a", 1)], now=two_hours_ago)

    evaluation = _run_lag_check(world, instance)

    assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR
    assert evaluation.metadata["oldest_pending_age_s"].value >= 7000


def test_wal_lag_check_passes_when_pending_rows_are_fresh_or_none(world: WalWorld, instance: dg.DagsterInstance) -> None:
    assert _run_lag_check(world, instance).passed
    world.append("orders", "a", 1)
    assert _run_lag_check(world, instance).passed


def test_compaction_schedule_requests_one_run_per_dataset_and_keeps_reader_state(world: WalWorld, instance: dg.DagsterInstance) -> None:
    changes = {ds: [Change.upsert(f"k{i}", i) for i in range(3)] for ds in ("orders", "users")}
    for ds, items in changes.items():
        for change in items:
            world.producer().append(ds, [change])
    defs = world.defs()
    tick_sensor("wal_sensor", defs=defs, instance=instance)
    at = datetime(2026, 1, 2, 3, 0, tzinfo=timezone.utc)

    tick = tick_schedule("wal_compaction_schedule", defs=defs, instance=instance, at=at)
    again = tick_schedule("wal_compaction_schedule", defs=defs, instance=instance, at=at)

    assert (tick.requested, tick.succeeded) == (2, 2)
    assert sorted(r.dagster_run.tags[DATASET_TAG] for r in tick.results) == ["orders", "users"]
    assert len(again.skipped_run_keys) == 2  # one compaction per dataset per day
    for ds, items in changes.items():
        reader = DatasetReader(world.s3, world.bucket, world.prefix, ds)
        assert reader.read() == (3, fold({}, items)) and reader.manifest().snapshot is not None


def test_a_fresh_instance_learns_every_dataset_partition_even_with_nothing_pending(world: WalWorld, instance: dg.DagsterInstance) -> None:
    world.append("orders", "a", 1)
    tick_sensor("wal_sensor", defs=world.defs(), instance=instance)

    with dg.DagsterInstance.ephemeral() as fresh:
        tick = tick_sensor("wal_sensor", defs=world.defs(), instance=fresh)
        assert tick.requested == 0 and fresh.get_dynamic_partitions("datasets") == ["orders"]
