"""Ctrl-C stops a verb that executes one Dagster run after another: it says so and exits 1 with click's
"Aborted!", instead of going on to the next shard (issue 42.3).

The signal is real (SIGINT to a `runstate` subprocess). A gated moto holds the first shard's delta upload,
so the signal lands inside that shard's run every time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import dagster as dg
import pytest

from runstate.wal import ensure_blob_bucket, ensure_wal_table
from runstate.wal.shards import shard_of
from runstate_tests.deployment.gate import GatedMotoServer
from runstate_tests.wal.shell import WalWorld, unique_name

RUNSTATE = str(Path(sys.executable).parent / "runstate")
SHARDS = 2  # RUNSTATE_WAL_FLUSH_SHARDS's default


@pytest.fixture(scope="module")
def gated_moto() -> Iterator[GatedMotoServer]:
    server = GatedMotoServer()
    yield server
    server.stop()


@pytest.fixture
def gated_world(gated_moto: GatedMotoServer, tmp_path: Path, pg_database: str) -> Iterator[WalWorld]:
    """A WAL table and bucket on the gated moto, and a Dagster home of the test's own."""
    dynamodb = boto3.client("dynamodb", endpoint_url=gated_moto.url, region_name="us-east-1")
    s3 = boto3.client("s3", endpoint_url=gated_moto.url, region_name="us-east-1")
    table, bucket = unique_name("wal"), unique_name("blobs")
    ensure_wal_table(dynamodb, table)
    ensure_blob_bucket(s3, bucket)
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    # Its storage is made here, before the command opens it (two makers can both stamp alembic's version).
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.get_runs_count()
    yield WalWorld(gated_moto.url, table, bucket, "datasets/", home, dynamodb, s3)
    gated_moto.gate.disarm()
    dynamodb.delete_table(TableName=table)


def command_env(world: WalWorld, pg_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "RUNSTATE_AWS_ENDPOINT_URL": world.endpoint,
        "RUNSTATE_WAL_TABLE": world.table,
        "RUNSTATE_BLOB_BUCKET": world.bucket,
        "RUNSTATE_BLOB_PREFIX": world.prefix,
        "RUNSTATE_PG_URL": pg_url,
        "DAGSTER_HOME": str(world.home),
    }


def one_dataset_per_shard() -> dict[int, str]:
    by_shard: dict[int, str] = {}
    for name in (f"ds{i}" for i in range(100)):
        by_shard.setdefault(shard_of(name, SHARDS), name)
    return by_shard


def is_a_delta_upload(environ: dict, _body: bytes) -> bool:
    return environ["REQUEST_METHOD"] == "PUT" and "/delta/" in environ["PATH_INFO"]


@pytest.mark.parametrize("verb", [["wal", "flush"], ["wal", "tick"]], ids=" ".join)
def test_ctrl_c_in_the_first_shards_run_stops_the_command_there(
    verb: list[str], gated_world: WalWorld, gated_moto: GatedMotoServer, pg_database: str
):
    datasets = one_dataset_per_shard()
    for dataset_id in datasets.values():
        gated_world.append(dataset_id, "k", 1)
    gated_moto.gate.arm(is_a_delta_upload)
    command = subprocess.Popen(
        [RUNSTATE, *verb],
        env=command_env(gated_world, pg_database),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        gated_moto.gate.wait_for_held(timeout=300)  # inside the first shard's run, at its upload
        command.send_signal(signal.SIGINT)
    finally:
        gated_moto.gate.disarm()
        out, err = command.communicate(timeout=300)

    with dg.DagsterInstance.from_config(str(gated_world.home)) as instance:
        runs = instance.get_runs()
    assert command.returncode == 1, (out, err)
    assert err.rstrip().endswith("Aborted!") and "interrupted: flush_wal run" in err, err
    assert [run.status for run in runs] == [dg.DagsterRunStatus.FAILURE]  # ended, and the only one
    first_shard = int(runs[0].tags["runstate/wal_shard"])
    [(_, untouched)] = [(shard, name) for shard, name in datasets.items() if shard != first_shard]
    assert set(gated_world.statuses(untouched).values()) == {"Pending"}


def test_a_stop_replaced_by_the_cancelled_jobs_error_is_raised_again(monkeypatch):
    """PySpark's Arrow collect asks the JVM for the job's result in a `finally`: the interrupt raised while
    it read rows is replaced by the cancellation's error, and the command must still stop as interrupted."""
    import runstate.cli as cli

    monkeypatch.setattr(cli, "_stop_signal", None)
    monkeypatch.setattr(cli, "_stop_raised", False)
    with pytest.raises(KeyboardInterrupt, match="terminated by SIGTERM"):
        try:
            try:
                cli.stop_the_command(signal.SIGTERM, None)
            finally:
                raise RuntimeError(
                    "Exception thrown in awaitResult"
                )  # the cancelled job, as PySpark raises it
        except RuntimeError:
            cli.stop_if_signalled()


def test_without_a_stop_signal_a_failed_job_is_its_own_error(monkeypatch):
    import runstate.cli as cli

    monkeypatch.setattr(cli, "_stop_signal", None)
    monkeypatch.setattr(cli, "_stop_raised", False)

    cli.stop_if_signalled()  # nothing to raise: the caller reports the job's failure
