"""A CLI tick killed with SIGKILL mid-run: the next CLI tick ends its run and frees its Spark slot.

The kill is real (a `runstate maintenance tick` subprocess and its JVM, by process group). The clock is
driven, not waited for: the dead worker's last heartbeat is moved a minute into the past.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from click.testing import CliRunner

from runstate.cli import main
from runstate.commands.ticking import CURSOR_KEY
from runstate.config import settings
from runstate.defs.runs.beats import beat, beat_ages
from runstate.defs.tags import SPARK_TAG
from runstate.maintenance import CachedTable, MaintenanceStore
from runstate_tests.support.devserver import poll

RUNSTATE = str(Path(sys.executable).parent / "runstate")
WORKER_JOB = "iceberg_maintenance"


@pytest.fixture
def cli_env(pg_database: str, pg_schema: str, dagster_home: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RUNSTATE_PG_URL", pg_database)
    monkeypatch.setenv("RUNSTATE_SCHEMA", pg_schema)
    settings.cache_clear()
    yield {**os.environ}
    settings.cache_clear()


def _worker_started(instance: dg.DagsterInstance, store: MaintenanceStore, job_id: str):
    """The worker run once it is STARTED, beating, and holds the job's claim."""
    runs = instance.get_runs(
        filters=dg.RunsFilter(job_name=WORKER_JOB, statuses=[dg.DagsterRunStatus.STARTED])
    )
    if runs and beat_ages(instance, [runs[0].run_id]) and store.queue.get_job(job_id).status == "running":
        return runs[0]
    return None


def test_a_killed_maintenance_tick_is_ended_by_the_next_tick_which_reuses_no_run_key(
    cli_env, pg_database, pg_schema
):
    with MaintenanceStore(pg_database, schema=pg_schema) as store:
        store.ensure_schema()
        store.cache.replace_table_cache([CachedTable("db", "orders", True, {})])
        job_id = store.submit("db", "orders", ["rewrite_manifests"])
        # The instance's SQLite storage is created here, before the child opens it: two processes
        # creating it at once can both stamp its alembic version ("more than one head present").
        with dg.DagsterInstance.get() as instance:
            instance.get_runs_count()
            child = subprocess.Popen(
                [RUNSTATE, "maintenance", "tick"],
                env=cli_env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # its Spark JVM dies with it
            )
            try:
                killed = poll(
                    lambda: _worker_started(instance, store, job_id), timeout=180, what="a worker run"
                )
            finally:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait(timeout=30)
            key = CURSOR_KEY.format("maintenance_queue_sensor")
            cursor = json.loads(instance.run_storage.get_cursor_values({key})[key])
            beat(instance, killed.run_id, age_s=60)  # a minute on, no beat since

            ticked = CliRunner().invoke(main, ["maintenance", "tick"])

            ended = instance.get_run_by_id(killed.run_id)
            held_slots = instance.get_runs_count(
                dg.RunsFilter(tags={SPARK_TAG: "session"}, statuses=[dg.DagsterRunStatus.STARTED])
            )
        assert child.returncode == -signal.SIGKILL
        assert cursor == {"requests": 1}  # stored before the run: the next request is maintenance-worker-2
        assert ticked.exit_code == 0, ticked.output
        assert ended.status == dg.DagsterRunStatus.FAILURE and held_slots == 0
        failure = instance_failure_message(ended.run_id)
        assert re.search(r"no heartbeat for \d+ s", failure)
        # The job the dead worker claimed is taken over once its lease ends, as before.
        assert store.queue.get_job(job_id).status == "running"


def instance_failure_message(run_id: str) -> str:
    with dg.DagsterInstance.get() as instance:
        [event] = instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
        return event.message or ""
