"""Issue 42.1 through the CLI: a `runstate wal flush` paused past the dead bound while another one takes
its shard over must not come back and finish its run.

As in the issue: RUNSTATE_RUN_DEAD_AFTER_S=6, one row in each of 24 datasets, flush A stopped (SIGSTOP)
once its run is STARTED, flush B run 10 s later (it fails A's run and flushes everything), then A
continued (SIGCONT). The Dagster instance is on Postgres, as a deployment's is, so a paused process
holds no lock that the other one needs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from runstate.commands.ticking import tick_sensor
from runstate.defs.eventstore.resources import EventStoreResource
from runstate.defs.runs.sensors import run_recorder
from runstate.wal import DatasetReader
from runstate_tests.support.devserver import poll
from runstate_tests.wal.shell import WalWorld

RUNSTATE = str(Path(sys.executable).parent / "runstate")
DEAD_AFTER_S = 6
DATASETS = [f"zombie{i:02d}" for i in range(24)]

pytestmark = pytest.mark.slow


@pytest.fixture
def dagster_home(tmp_path: Path, fresh_database: str) -> Iterator[tuple[Path, str]]:
    """A Dagster home whose run and event storage is a Postgres database of the test's own."""
    home = tmp_path / "dagster"
    home.mkdir()
    url = fresh_database.replace("postgresql://", "postgresql+psycopg2://", 1)
    (home / "dagster.yaml").write_text(
        "storage:\n  postgres:\n    postgres_url:\n      env: DAGSTER_PG_URL\ntelemetry:\n  enabled: false\n"
    )
    yield home, url


def cli_env(world: WalWorld, home: Path, dagster_url: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNSTATE_", "DAGSTER_"))}
    return {
        **env,
        "RUNSTATE_HOME": str(tmp_path),
        "RUNSTATE_AWS_ENDPOINT_URL": world.endpoint,
        "RUNSTATE_WAL_TABLE": world.table,
        "RUNSTATE_BLOB_BUCKET": world.bucket,
        "RUNSTATE_BLOB_PREFIX": world.prefix,
        "DAGSTER_HOME": str(home),
        "DAGSTER_PG_URL": dagster_url,
        "RUNSTATE_RUN_DEAD_AFTER_S": str(DEAD_AFTER_S),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def started_flush_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    return list(
        instance.get_runs(dg.RunsFilter(job_name="flush_wal", statuses=[dg.DagsterRunStatus.STARTED]))
    )


def pause_mid_run(process: subprocess.Popen, instance: dg.DagsterInstance) -> dg.DagsterRun:
    """SIGSTOP `process` while one of its flush runs is STARTED; that run. (A run that ended just before
    the signal does not count: the process goes on to its next shard's run.)"""
    ended: set[str] = set()
    while True:
        [run, *_] = poll(
            lambda: [run for run in started_flush_runs(instance) if run.run_id not in ended],
            timeout=300,
            every=0.02,
            what="a STARTED flush run of the first `wal flush`",
        )
        process.send_signal(signal.SIGSTOP)
        if instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED:
            return run
        ended.add(run.run_id)
        process.send_signal(signal.SIGCONT)


def test_a_paused_cli_flush_declared_dead_stops_when_it_resumes_and_changes_nothing(
    world: WalWorld, dagster_home, tmp_path: Path, monkeypatch, pg_database: str, pg_schema: str
):
    home, dagster_url = dagster_home
    env = cli_env(world, home, dagster_url, tmp_path)
    for dataset in DATASETS:
        world.append(dataset, "k", dataset)
    monkeypatch.setenv("DAGSTER_PG_URL", dagster_url)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        a = subprocess.Popen(
            [RUNSTATE, "wal", "flush"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            zombie = pause_mid_run(a, instance)
            time.sleep(10)
            b = subprocess.run(
                [RUNSTATE, "wal", "flush"], env=env, capture_output=True, text=True, timeout=600
            )
        finally:
            a.send_signal(signal.SIGCONT)
        a_out, a_err = a.communicate(timeout=120)

        assert b.returncode == 0, b.stdout + b.stderr
        assert a.returncode == 1, a_out + a_err
        errors = [line for line in a_err.splitlines() if line.startswith("Error: ")]
        assert len(errors) == 1 and errors[0].startswith(f"Error: run {zombie.run_id} "), a_err
        assert "declared dead" in errors[0] and "this process stops here" in errors[0]
        assert "Traceback" not in a_err
        assert instance.get_run_by_id(zombie.run_id).status == dg.DagsterRunStatus.FAILURE
        kinds = [e.dagster_event_type for e in instance.all_logs(zombie.run_id) if e.dagster_event_type]
        assert dg.DagsterEventType.RUN_SUCCESS not in kinds
        after_failure = kinds[kinds.index(dg.DagsterEventType.RUN_FAILURE) :]
        assert dg.DagsterEventType.ASSET_MATERIALIZATION not in after_failure
        for dataset in DATASETS:  # every row applied once, in one blob
            reader = DatasetReader(world.s3, world.bucket, world.prefix, dataset)
            assert [(b.first_seq, b.last_seq) for b in reader.manifest().blobs()] == [(1, 1)]
            assert reader.read() == (1, {"k": dataset}) and world.statuses(dataset)[1].startswith("Applied")

        store = EventStoreResource(backend="postgres", pg_url=pg_database, pg_schema=pg_schema)
        recorder = dg.Definitions(sensors=[run_recorder], resources={"event_store": store})
        tick_sensor("run_recorder", defs=recorder, instance=instance)
        recorded = [event.event_type for event in store.get_store().fetch(zombie.run_id)]
        assert "RunFailed" in recorded and "RunCompleted" not in recorded
