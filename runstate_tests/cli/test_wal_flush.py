"""`runstate wal flush [--dataset X]`: flush now, in-process, fenced against a live run of the shard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from click.testing import CliRunner

from runstate.cli import main
from runstate.commands.flush import ShardFences
from runstate.commands.ticking import default_defs
from runstate.defs.runs.beats import beat
from runstate.defs.tags import WAL_SHARD_TAG
from runstate.wal.shards import shard_of
from runstate_tests.wal.shell import WalWorld

RUNSTATE = str(Path(sys.executable).parent / "runstate")


def wal(wal_cli: CliRunner, *args: str) -> tuple[int, str]:
    result = wal_cli.invoke(main, ["wal", *args])
    return result.exit_code, result.output


def test_flush_applies_one_dataset_now_and_a_second_flush_finds_nothing(wal_cli: CliRunner, world: WalWorld):
    for i in range(3):
        world.append("orders", f"k{i}", i)
    world.append("users", "u", 1)

    code, flushed = wal(wal_cli, "flush", "--dataset", "orders")
    again_code, again = wal(wal_cli, "flush", "--dataset", "orders")

    assert code == 0, flushed
    assert "orders: 3 row(s) applied, version 3" in flushed
    assert (again_code, again.strip()) == (0, "nothing to flush: no Pending rows for 'orders'")
    assert json.loads(wal(wal_cli, "read", "--dataset", "orders")[1])["version"] == 3
    assert set(world.statuses("users").values()) == {"Pending"}  # only the dataset asked for


def test_a_shard_held_by_a_live_run_is_reported_with_its_run_and_nothing_is_flushed(
    wal_cli: CliRunner, world: WalWorld
):
    world.append("orders", "a", 1)
    shard = shard_of("orders", default_defs().resources["wal"].flush_shards)
    with dg.DagsterInstance.get() as instance:
        holder = instance.create_run_for_job(
            default_defs().resolve_job_def("flush_wal"),
            tags={WAL_SHARD_TAG: str(shard)},
            run_config={"ops": {"flush_wal_shard": {"config": {"shard": shard, "batches": []}}}},
        )
        instance.handle_run_event(
            holder.run_id, dg.DagsterEvent(dg.DagsterEventType.RUN_START.value, job_name=holder.job_name)
        )
        beat(instance, holder.run_id)  # its worker beat just now: alive

        code, output = wal(wal_cli, "flush", "--wait", "0")

    assert code == 1
    assert f"shard {shard} is held by run {holder.run_id}" in output and "heartbeat" in output
    assert set(world.statuses("orders").values()) == {"Pending"}


def test_a_shard_another_flush_command_holds_is_named_and_left_to_it(
    wal_cli: CliRunner, world: WalWorld, pg_database: str
):
    world.append("orders", "a", 1)
    shard = shard_of("orders", default_defs().resources["wal"].flush_shards)
    other = ShardFences(pg_database, world.table)  # as another `runstate wal flush` of this WAL would
    try:
        assert other.acquire(shard, deadline=0, instance=None)  # a free lock: no holder to judge
        code, output = wal(wal_cli, "flush", "--wait", "0")
    finally:
        other.close()

    assert code == 1
    assert f"shard {shard} is being flushed by runstate wal flush pid {os.getpid()}" in output
    assert set(world.statuses("orders").values()) == {"Pending"}


def test_flush_refuses_a_bad_dataset_id_before_reading_anything(wal_cli: CliRunner):
    code, output = wal(wal_cli, "flush", "--dataset", "bad id\n")

    assert code == 1 and output.startswith("Error:")


@pytest.mark.slow  # six commands, each loading the code location
def test_six_racing_flushes_make_one_run_per_shard_and_each_says_what_it_did(
    world: WalWorld, fresh_database: str, tmp_path: Path
):
    shards = default_defs().resources["wal"].flush_shards
    datasets = [f"race{i}" for i in range(8)]
    assert {shard_of(dataset_id, shards) for dataset_id in datasets} == set(range(shards))
    for dataset_id in datasets:
        world.append(dataset_id, "k", 1)
    # The deployment's kind of instance: Postgres storage, made here before six processes open it at once.
    home = tmp_path / "postgres_home"
    home.mkdir()
    storage = fresh_database.replace("postgresql://", "postgresql+psycopg2://", 1)
    (home / "dagster.yaml").write_text(
        f"storage:\n  postgres:\n    postgres_url: {storage}\ntelemetry:\n  enabled: false\n"
    )
    env = {
        **os.environ,
        "RUNSTATE_AWS_ENDPOINT_URL": world.endpoint,
        "RUNSTATE_WAL_TABLE": world.table,
        "RUNSTATE_BLOB_BUCKET": world.bucket,
        "RUNSTATE_BLOB_PREFIX": world.prefix,
        "RUNSTATE_PG_URL": fresh_database,
        "DAGSTER_HOME": str(home),
    }
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.get_runs_count()
        racers = [
            subprocess.Popen(
                [RUNSTATE, "wal", "flush", "--wait", "300"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(6)
        ]
        outputs = [racer.communicate(timeout=900) for racer in racers]
        runs = instance.get_runs(filters=dg.RunsFilter(job_name="flush_wal"))

    assert [racer.returncode for racer in racers] == [0] * 6, outputs
    seen = [(run.run_id, run.tags.get(WAL_SHARD_TAG), run.status.value) for run in runs]
    assert sorted(run.tags[WAL_SHARD_TAG] for run in runs) == [str(shard) for shard in range(shards)], (
        seen,
        outputs,
    )
    assert {run.status for run in runs} == {dg.DagsterRunStatus.SUCCESS}, (seen, outputs)
    for out, _ in outputs:  # each flushed a shard, found it flushed meanwhile, or found nothing to flush
        said = out.strip() == "nothing to flush: no Pending rows" or all(
            f"shard {shard}: " in out for shard in range(shards)
        )
        assert said, out
    statuses = {status for dataset_id in datasets for status in world.statuses(dataset_id).values()}
    assert all(status.startswith("Applied#") for status in statuses), statuses
