"""The seed's six scenarios, driven through wal_sensor ticks and flush_wal shard runs against moto's server."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from runstate.commands.ticking import CURSOR_KEY, tick_sensor
from runstate.defs.runs.beats import beat
from runstate.defs.tags import WAL_SHARD_TAG
from runstate.defs.wal.sensors import SENSOR_INTERVAL_S, wal_sensor
from runstate.wal import Change, DatasetReader
from runstate.wal.changes import fold
from runstate.wal.layout import APPLIED_PREFIX, PENDING, ensure_wal_table
from runstate.wal.shards import shard_of
from runstate_tests.support.runs import started_run
from runstate_tests.wal.shell import PUT_FAILURES, FlakyS3WalResource, WalWorld, unique_name

REPO_ROOT = Path(__file__).resolve().parents[2]


def reader_state(world: WalWorld, dataset_id: str) -> tuple[int, dict]:
    return DatasetReader(world.s3, world.bucket, world.prefix, dataset_id).read()


def blob_rows(world: WalWorld, key: str) -> int:
    body = world.s3.get_object(Bucket=world.bucket, Key=key)["Body"].read()
    return pq.read_table(io.BytesIO(body)).num_rows


def all_applied(world: WalWorld, dataset_id: str) -> bool:
    return all(status.startswith(APPLIED_PREFIX) for status in world.statuses(dataset_id).values())


def shard_report(result: dg.ExecuteInProcessResult) -> dict:
    """The flush_wal_shard output's metadata: datasets, flushed, failed, failures..."""
    [output] = [e for e in result.all_node_events if e.event_type == dg.DagsterEventType.STEP_OUTPUT]
    return {key: value.value for key, value in output.step_output_data.metadata.items()}


def planned_batches(result: dg.ExecuteInProcessResult) -> list[dict]:
    return result.dagster_run.run_config["ops"]["flush_wal_shard"]["config"]["batches"]


def test_happy_path_three_appends_give_one_flush_one_blob_three_applied(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    defs = world.defs()
    changes = [Change.upsert(f"k{i}", {"n": i}) for i in range(3)]
    seqs = [world.producer().append("orders", [change]) for change in changes]

    tick = tick_sensor("wal_sensor", defs=defs, instance=instance)

    assert seqs == [1, 2, 3]
    assert (tick.requested, tick.succeeded, tick.failed) == (1, 1, 0)
    blobs = world.blob_keys("orders")
    assert len(blobs) == 1 and blob_rows(world, blobs[0]) == 3
    assert sorted(world.statuses("orders")) == [1, 2, 3] and all_applied(world, "orders")
    assert reader_state(world, "orders") == (3, fold({}, changes))


def test_happy_path_records_a_materialization_and_a_dynamic_partition(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    for i in range(3):
        world.append("orders", f"k{i}", i)

    tick_sensor("wal_sensor", defs=world.defs(), instance=instance)

    assert instance.get_dynamic_partitions("datasets") == ["orders"]
    event = instance.get_latest_materialization_event(dg.AssetKey("dataset_snapshots"))
    materialization = event.asset_materialization
    assert materialization.partition == "orders"
    metadata = {k: v.value for k, v in materialization.metadata.items()}
    assert metadata["rows"] == 3 and metadata["first_seq"] == 1 and metadata["last_seq"] == 3
    assert metadata["blob_key"] == world.blob_keys("orders")[0] and metadata["blob_bytes"] > 0


def test_a_tick_after_the_flush_requests_nothing(world: WalWorld, instance: dg.DagsterInstance) -> None:
    defs = world.defs()
    world.append("orders", "a", 1)
    tick_sensor("wal_sensor", defs=defs, instance=instance)

    again = tick_sensor("wal_sensor", defs=defs, instance=instance)

    assert again.requested == 0 and again.skip_reason
    assert len(world.blob_keys("orders")) == 1


def test_interruption_s3_put_fails_twice_then_the_dataset_is_retried_inside_the_run(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    fault_key = unique_name("fault")
    PUT_FAILURES[fault_key] = 2
    defs = world.defs(world.resource(FlakyS3WalResource, fault_key=fault_key))
    changes = [Change.upsert(f"k{i}", i) for i in range(5)]
    for change in changes:
        world.producer().append("orders", [change])

    tick = tick_sensor("wal_sensor", defs=defs, instance=instance)

    assert PUT_FAILURES[fault_key] == 0  # both injected failures really happened
    assert (tick.requested, tick.succeeded) == (1, 1)
    event = instance.get_latest_materialization_event(dg.AssetKey("dataset_snapshots"))
    assert event.asset_materialization.metadata["attempts"].value == 3
    assert all_applied(world, "orders") and reader_state(world, "orders") == (5, fold({}, changes))


def test_interruption_longer_than_the_retries_is_reported_and_flushed_by_a_later_tick_under_a_new_run_key(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    fault_key = unique_name("fault")
    PUT_FAILURES[fault_key] = 10  # outlasts the dataset's 3 tries in the run
    defs = world.defs(world.resource(FlakyS3WalResource, fault_key=fault_key))
    changes = [Change.upsert(f"k{i}", i) for i in range(4)]
    for change in changes:
        world.producer().append("orders", [change])

    failed = tick_sensor("wal_sensor", defs=defs, instance=instance)
    pending_after_failure = set(world.statuses("orders").values())
    PUT_FAILURES[fault_key] = 0  # the fault clears
    recovered = tick_sensor("wal_sensor", defs=defs, instance=instance)

    assert (failed.requested, failed.succeeded) == (1, 1)  # the run itself records the failure
    report = shard_report(failed.results[0])
    assert (report["failed"], list(report["failures"])) == (1, ["orders"])
    assert "injected: S3 is down" in report["failures"]["orders"]
    assert pending_after_failure == {PENDING}
    assert (recovered.requested, recovered.succeeded) == (1, 1)
    first_key = failed.results[0].dagster_run.tags["dagster/run_key"]
    second_key = recovered.results[0].dagster_run.tags["dagster/run_key"]
    assert first_key.endswith("-g0") and second_key == first_key[: -len("-g0")] + "-g1"
    assert all_applied(world, "orders") and reader_state(world, "orders") == (4, fold({}, changes))


def _start_crash_child(world: WalWorld, hang_at: str) -> subprocess.Popen:
    spec = {
        "home": str(world.home),
        "resource": {
            "endpoint_url": world.endpoint,
            "region": "us-east-1",
            "table": world.table,
            "bucket": world.bucket,
            "prefix": world.prefix,
            "hang_at": hang_at,
        },
    }
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-m", "runstate_tests.wal.shell", json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO_ROOT,
    )


def _kill_when_ready(child: subprocess.Popen) -> None:
    """Wait for the child to block inside the flush, then SIGKILL it there."""
    line = child.stdout.readline()
    try:
        assert line.strip() == "READY", f"crash child ended before the flush point (said {line!r})"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL


@pytest.mark.parametrize("hang_at", ["mid_marks", "after_delta_put"])
def test_worker_crash_mid_flush_of_a_shard_run_then_a_later_tick_applies_everything_once(
    world: WalWorld, instance: dg.DagsterInstance, hang_at: str
) -> None:
    datasets = ["orders", "users", "items"]
    changes = {ds: [Change.upsert(f"k{i}", {"v": i, "ds": ds}) for i in range(10)] for ds in datasets}
    for ds in datasets:
        for change in changes[ds]:
            world.producer().append(ds, [change])
    child = _start_crash_child(world, hang_at)
    _kill_when_ready(child)
    lost_runs = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
    assert len(lost_runs) >= 1  # the killed runs never reported anything
    for run in lost_runs:  # the clock moves on: the killed worker's last heartbeat is a minute old
        beat(instance, run.run_id, age_s=60)
    defs = world.defs()

    tick = tick_sensor("wal_sensor", defs=defs, instance=instance)

    assert tick.requested >= 1 and tick.failed == 0
    for ds in datasets:
        assert sorted(world.statuses(ds)) == list(range(1, 11)) and all_applied(world, ds)
        assert reader_state(world, ds) == (10, fold({}, changes[ds]))
        manifest = DatasetReader(world.s3, world.bucket, world.prefix, ds).manifest()
        covered = [seq for ref in manifest.blobs() for seq in range(ref.first_seq, ref.last_seq + 1)]
        assert covered == list(range(1, 11))  # every seq in exactly one blob: applied once


def test_a_lost_run_holds_its_shard_while_it_beats_and_is_failed_once_its_heartbeat_is_stale(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    for i in range(10):
        world.append("orders", f"k{i}", i)
    _kill_when_ready(_start_crash_child(world, "after_delta_put"))
    defs = world.defs()
    world.append("orders", "late", 1)  # new work for the same shard must wait too
    [lost] = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
    beat(instance, lost.run_id)  # as if its worker had just beaten: it counts as alive

    held = tick_sensor("wal_sensor", defs=defs, instance=instance)
    statuses_while_held = set(world.statuses("orders").values())
    beat(instance, lost.run_id, age_s=60)  # a minute later, no beat since
    recovered = tick_sensor("wal_sensor", defs=defs, instance=instance)

    assert held.requested == 0 and f"held by run {lost.run_id}" in held.skip_reason
    assert statuses_while_held == {PENDING}
    assert instance.get_run_by_id(lost.run_id).status == dg.DagsterRunStatus.FAILURE
    assert (recovered.requested, recovered.succeeded) == (1, 1)
    assert all_applied(world, "orders") and reader_state(world, "orders")[0] == 11


def test_a_shard_held_by_a_run_of_any_job_or_state_gets_no_flush_of_its_own(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    """Issue 39.1: in an instance without the project's tag limits, the sensor's own holder check is the
    one-run-per-shard rule: a compaction of the shard holds it, as does a flush still launching."""
    world.append("orders", "a", 1)
    defs = world.defs()
    shard = str(shard_of("orders", world.resource().flush_shards))
    compaction = started_run(instance, defs.resolve_job_def("compact_wal"), tags={WAL_SHARD_TAG: shard})
    beat(instance, compaction.run_id)

    by_compaction = tick_sensor("wal_sensor", defs=defs, instance=instance)
    instance.report_run_failed(compaction)
    launching = instance.create_run_for_job(
        defs.resolve_job_def("flush_wal"),
        tags={WAL_SHARD_TAG: shard},
        run_config={"ops": {"flush_wal_shard": {"config": {"shard": int(shard), "batches": []}}}},
    )
    instance.handle_run_event(
        launching.run_id, dg.DagsterEvent(dg.DagsterEventType.PIPELINE_STARTING.value, job_name="flush_wal")
    )
    by_launch = tick_sensor("wal_sensor", defs=defs, instance=instance)

    assert by_compaction.requested == 0 and f"held by run {compaction.run_id}" in by_compaction.skip_reason
    assert by_launch.requested == 0 and f"held by run {launching.run_id}, STARTING" in by_launch.skip_reason
    assert set(world.statuses("orders").values()) == {PENDING}


def test_duplicate_signals_same_seq_from_stream_and_sweep_is_flushed_once(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    defs = world.defs()
    seq = world.append("orders", "a", 1, client_token="tok-1")
    again = world.append("orders", "a", 1, client_token="tok-1")  # a retried append: same row

    first = tick_sensor("wal_sensor", defs=defs, instance=instance)
    # Lose the cursor: the stream replays the same record and the sweep finds nothing new.
    instance.run_storage.set_cursor_values({CURSOR_KEY.format("wal_sensor"): ""})
    second = tick_sensor("wal_sensor", defs=defs, instance=instance)

    assert seq == again == 1 and sorted(world.statuses("orders")) == [1]
    assert (first.requested, first.succeeded) == (1, 1)
    assert second.requested == 0
    assert len(world.blob_keys("orders")) == 1 and reader_state(world, "orders") == (1, {"a": 1})


def test_duplicate_run_of_a_flushed_shard_writes_nothing(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    defs = world.defs()
    for i in range(3):
        world.append("orders", f"k{i}", i)
    first = tick_sensor("wal_sensor", defs=defs, instance=instance)
    run_config = first.results[0].dagster_run.run_config
    manifest_before = DatasetReader(world.s3, world.bucket, world.prefix, "orders").manifest()

    duplicate = defs.resolve_job_def("flush_wal").execute_in_process(run_config=run_config, instance=instance)

    assert duplicate.success
    assert not duplicate.asset_materializations_for_node("flush_wal_shard")
    assert DatasetReader(world.s3, world.bucket, world.prefix, "orders").manifest() == manifest_before
    assert len(world.blob_keys("orders")) == 1


def test_large_batch_split_rows_over_the_limit_give_full_batches_and_the_rest_in_one_shard_run(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    """The seed's 1200 rows at 500 a batch, scaled by a tenth: 1,200 appends to moto cost the suite minutes.
    The planner's split of 1200 rows at the default 500 is test_source.py's; the default is asserted below."""
    defs = world.defs(world.resource(max_batch_size=50))
    producer = world.producer()
    changes = [Change.upsert(f"k{i}", i) for i in range(120)]
    for change in changes:
        producer.append("big", [change])

    tick = tick_sensor("wal_sensor", defs=defs, instance=instance)

    assert (tick.requested, tick.succeeded) == (1, 1)
    assert [len(batch["seqs"]) for batch in planned_batches(tick.results[0])] == [50, 50, 20]
    blobs = world.blob_keys("big")
    assert [blob_rows(world, key) for key in blobs] == [50, 50, 20]
    assert all_applied(world, "big") and reader_state(world, "big") == (120, fold({}, changes))


def test_timer_drift_skipped_and_late_ticks_lose_nothing(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    defs = world.defs()
    changes = [Change.upsert(f"k{i}", i) for i in range(9)]
    for change in changes[:3]:
        world.producer().append("orders", [change])
    # Three timer periods pass with no tick at all (skipped ticks), while appends keep coming.
    for change in changes[3:6]:
        world.producer().append("orders", [change])
    late = tick_sensor("wal_sensor", defs=defs, instance=instance)
    early = tick_sensor("wal_sensor", defs=defs, instance=instance)  # a tick right after: nothing new
    for change in changes[6:]:
        world.producer().append("orders", [change])
    next_tick = tick_sensor("wal_sensor", defs=defs, instance=instance)

    assert (late.requested, late.succeeded) == (1, 1)
    assert early.requested == 0
    assert (next_tick.requested, next_tick.succeeded) == (1, 1)
    assert all_applied(world, "orders") and reader_state(world, "orders") == (9, fold({}, changes))


def test_the_sensor_ticks_every_5_s_a_shard_gets_two_runs_per_30_s_and_a_blob_at_most_500_rows() -> None:
    from runstate.defs.wal.resources import WalResource

    assert wal_sensor.minimum_interval_seconds == SENSOR_INTERVAL_S == 5
    assert wal_sensor.job_name == "flush_wal"
    assert WalResource().min_run_interval_s == 15
    assert WalResource().max_batch_size == 500


def test_model_check_random_workload_with_duplicates_and_faults_drains_to_the_plain_fold(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    """Shell-level model check (the core's own runs 5,000 changes): random appends over 5 datasets in 2 shards,
    retried appends with the same client token, S3 faults that sometimes outlast a dataset's tries in a run,
    ticks in between."""
    import random

    rng = random.Random(20261126)
    fault_key = unique_name("fault")
    defs = world.defs(world.resource(FlakyS3WalResource, fault_key=fault_key, max_batch_size=25))
    producer = world.producer()
    expected: dict[str, list[Change]] = {}
    reported_failures = 0
    for step in range(240):
        dataset_id = f"ds{rng.randrange(5)}"
        key = f"k{rng.randrange(30)}"
        change = Change.delete(key) if rng.random() < 0.2 else Change.upsert(key, rng.randrange(1000))
        token = f"t{step}"
        producer.append(dataset_id, [change], client_token=token)
        if rng.random() < 0.2:
            producer.append(dataset_id, [change], client_token=token)  # a retried append: no second row
        expected.setdefault(dataset_id, []).append(change)
        if step % 60 == 59:
            PUT_FAILURES[fault_key] = rng.choice([0, 2, 20])  # 20 outlasts 3 tries of every dataset of a run
            tick = tick_sensor("wal_sensor", defs=defs, instance=instance)
            reported_failures += sum(shard_report(result)["failed"] for result in tick.results)

    PUT_FAILURES[fault_key] = 0
    for _ in range(10):  # the fault has cleared: later ticks drain everything
        if tick_sensor("wal_sensor", defs=defs, instance=instance).requested == 0:
            break

    assert reported_failures  # the faults really outlasted some datasets' tries
    for dataset_id, changes in expected.items():
        assert len(world.statuses(dataset_id)) == len(changes)  # duplicates wrote no extra row
        assert all_applied(world, dataset_id)
        assert reader_state(world, dataset_id) == (len(changes), fold({}, changes))
    shards = {run.tags[WAL_SHARD_TAG] for run in instance.get_runs()}
    assert shards == {"0", "1"}


def _recreate_wal_storage(world: WalWorld) -> None:
    """What a restarted moto does: the WAL table and the bucket come back empty, the Dagster DB stays."""
    world.dynamodb.delete_table(TableName=world.table)
    for obj in world.s3.list_objects_v2(Bucket=world.bucket).get("Contents", []):
        world.s3.delete_object(Bucket=world.bucket, Key=obj["Key"])
    ensure_wal_table(world.dynamodb, world.table)


def test_recreated_wal_table_is_flushed_again_under_a_kept_dagster_instance(
    world: WalWorld, instance: dg.DagsterInstance
) -> None:
    defs = world.defs()
    changes = [Change.upsert(f"k{i}", {"n": i}) for i in range(3)]
    for change in changes:
        world.producer().append("orders", [change])
    tick_sensor("wal_sensor", defs=defs, instance=instance)
    _recreate_wal_storage(world)
    for change in changes:
        world.producer().append("orders", [change])

    tick = tick_sensor("wal_sensor", defs=defs, instance=instance)

    assert (tick.requested, tick.succeeded, tick.skipped_run_keys) == (1, 1, [])
    assert all_applied(world, "orders")
    assert reader_state(world, "orders") == (3, fold({}, changes))
