"""Plain Dagster commands work in a project folder after `services up`, without the `runstate` wrapper.

The project folder is a copy of the checkout's dagster.yaml and workspace.yaml with the `.env` block
that `services up` writes (the same function, pointed at this test's database and moto). The commands
get an environment with none of the endpoints in it: whatever they find, they found in `.env`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg
import pytest
from dagster._core.storage.dagster_run import RunRecord

from runstate.defs.dataset_tables.sensors import MERGE_SHARDS
from runstate.procfs import every_stat
from runstate.services.env_file import write_env_file
from runstate.wal import Change, DatasetReader, WalProducer, WalTable
from runstate.wal import layout as t
from runstate_tests.deployment.sampling import Sampler
from runstate_tests.support.databases import create_database, drop_database, unique
from runstate_tests.support.deployment import (
    HOURLY_EXPORTS,
    RESTART_BOUND_S,
    check_flush_after_restart,
    deployment_env,
)
from runstate_tests.support.devserver import RUNSTATE, free_port, graphql, poll, wait_for_graphql
from runstate_tests.support.moto import MotoProcess, moto_client

REPO_ROOT = Path(__file__).resolve().parents[2]
DAGSTER = str(Path(sys.executable).parent / "dagster")
ENDPOINT_VARS = ("RUNSTATE_", "DAGSTER_PG_URL", "DAGSTER_HOME", "SNOWFLAKE_")
LAUNCHED_RUNS = [
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]
IN_PROGRESS_RUNS = [dg.DagsterRunStatus.QUEUED, *LAUNCHED_RUNS]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # each wait has its own deadline


@pytest.fixture
def project(tmp_path: Path, fresh_database: str, moto_endpoint: str, monkeypatch) -> Iterator[Path]:
    for name in ("dagster.yaml", "workspace.yaml"):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    monkeypatch.setenv("RUNSTATE_HOME", str(tmp_path))  # where write_env_file puts `.env`
    write_env_file(
        {
            "RUNSTATE_PG_URL": fresh_database,
            "DAGSTER_PG_URL": fresh_database.replace("postgresql://", "postgresql+psycopg2://", 1),
            "RUNSTATE_AWS_ENDPOINT_URL": moto_endpoint,
        }
    )
    yield tmp_path


def bare_env(project: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without one endpoint in it; RUNSTATE_HOME names the project, as a checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENDPOINT_VARS)}
    return {**env, "RUNSTATE_HOME": str(project), "DAGSTER_TELEMETRY_ENABLED": "false", **extra}


def validate(project: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [DAGSTER, "definitions", "validate", "-w", "workspace.yaml"],
        cwd=project,
        env=bare_env(project, DAGSTER_HOME=str(project)),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_dagster_definitions_validate_finds_the_instance_settings_in_dot_env(project):
    passed = validate(project)
    (project / ".env").unlink()
    without = validate(project)

    assert passed.returncode == 0, passed.stdout[-3000:] + passed.stderr[-3000:]
    assert "All code locations passed validation" in passed.stdout + passed.stderr
    assert without.returncode != 0 and "DAGSTER_PG_URL" in without.stdout + without.stderr


def test_plain_dagster_dev_serves_the_deployment_on_the_dot_env_instance(project, fresh_database):
    port = free_port()
    log = project / "dagster-dev.log"
    with open(log, "wb") as out:
        # No DAGSTER_HOME: dagster dev makes a temporary home but reads dagster.yaml from its folder.
        dev = subprocess.Popen(
            [DAGSTER, "dev", "-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml"],
            cwd=project,
            env=bare_env(project),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        assert wait_for_graphql(port, dev, timeout=300), log.read_text()[-3000:]
        location = poll(lambda: _loaded_location(port), timeout=300, what="code location loaded")
        queue = graphql(
            port, "{ instance { runQueueConfig { maxConcurrentRuns tagConcurrencyLimitsYaml } } }"
        )

        assert location == "runstate"
        config = queue["instance"]["runQueueConfig"]
        assert config["maxConcurrentRuns"] == 8 and "runstate/wal_shard" in config["tagConcurrencyLimitsYaml"]
        with psycopg.connect(fresh_database) as conn:  # the run storage is the database named in .env
            assert conn.execute("SELECT to_regclass('runs')").fetchone()[0] is not None
    finally:
        _stop(dev)


def _loaded_location(port: int) -> str | None:
    query = """{ workspaceOrError { ... on Workspace { locationEntries {
        name loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }"""
    entries = graphql(port, query)["workspaceOrError"]["locationEntries"]
    for entry in entries:
        loaded = entry["locationOrLoadError"] or {}
        if loaded.get("__typename") == "PythonError":
            raise AssertionError(f"code location {entry['name']} failed to load: {loaded['message']}")
        if entry["loadStatus"] == "LOADED" and loaded.get("__typename") == "RepositoryLocation":
            return entry["name"]
    return None


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # whatever of its group is left (code server, daemon)
    except ProcessLookupError:
        pass
    process.wait()


# --- a plain instance: `dagster dev -m runstate.definitions` with a dagster.yaml of storage only ----------

STORAGE_ONLY = (
    "storage:\n  postgres:\n    postgres_url:\n      env: DAGSTER_PG_URL\ntelemetry:\n  enabled: false\n"
)
DATASETS = [f"plain{i:03d}" for i in range(100)]
WAL_TABLE, BUCKET, PREFIX = "runstate_wal", "runstate-blobs", "datasets/"
FLUSH_AFTER_RESTART_S = 300  # the wait for the row; what it may cost is RESTART_BOUND_S
# RUNSTATE_SPARK_SESSIONS' default: the `runstate_spark` pool's limit, which spark_pool_sensor sets in an
# instance that has none.
SPARK_CAP = 2


class PlainDeployment:
    """`dagster dev -m runstate.definitions` in a folder of its own, killable as a whole and started again."""

    def __init__(
        self, folder: Path, env: dict[str, str], moto_url: str, dagster_db: str, instance: dg.DagsterInstance
    ) -> None:
        self.folder, self.env, self.moto_url = folder, env, moto_url
        self.dagster_db, self.instance = dagster_db, instance  # the run storage, as the test reads it
        self.process: subprocess.Popen | None = None
        self.port = 0
        self.log = folder / "dagster-dev.log"

    def start(self) -> None:
        for _ in range(3):  # a port another process took before the webserver bound it: another port
            self.port = free_port()
            with open(self.log, "ab") as out:
                self.process = subprocess.Popen(
                    [DAGSTER, "dev", "-h", "127.0.0.1", "-p", str(self.port), "-m", "runstate.definitions"],
                    cwd=self.folder,
                    env=self.env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            if wait_for_graphql(self.port, self.process, timeout=300):
                break
            self.kill()
        assert self.process is not None, self.log.read_text(errors="replace")[-3000:]
        poll(lambda: _loaded_location(self.port), timeout=300, every=1, what="code location loaded")

    def kill(self) -> None:
        """SIGKILL to its whole process group at once (dagster dev, webserver, daemon, code server, run
        workers and their JVMs), as a lost host or an OOM-killed container does; returns once none is left."""
        assert self.process is not None
        group = self.process.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        self.process.wait(timeout=60)
        poll(lambda: not _group_alive(group), timeout=120, every=0.2, what="the killed group gone")
        self.process = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def aws(self, service: str) -> Any:
        return moto_client(self.moto_url, service)


def _group_alive(pgid: int) -> bool:
    return any(fields[0] != "Z" and int(fields[2]) == pgid for _, fields in every_stat())


@pytest.fixture
def plain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PlainDeployment]:
    names = [unique("rs_plain"), unique("rs_plain_dagster")]
    pg_url, dagster_url = (create_database(name) for name in names)
    moto = MotoProcess()
    (tmp_path / "dagster.yaml").write_text(STORAGE_ONLY)
    # On-demand flush runs: the kill below comes while one launches, a moment only on-demand runs have
    # (always-on runs through a kill and a restart: test_always_on).
    env = deployment_env(
        tmp_path,
        pg_url,
        dagster_url,
        moto.url,
        dagster_home=tmp_path,
        RUNSTATE_DATASET_MERGE_INTERVAL_S="10",
        RUNSTATE_WAL_FLUSH_MODE="on-demand",
        **HOURLY_EXPORTS,
    )
    upgrade = subprocess.run(
        [RUNSTATE, "db", "upgrade"], env=env, capture_output=True, text=True, timeout=600
    )
    assert upgrade.returncode == 0, upgrade.stderr[-3000:]
    monkeypatch.setenv("DAGSTER_PG_URL", env["DAGSTER_PG_URL"])  # read once, as the instance loads
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    deployment = PlainDeployment(tmp_path, env, moto.url, dagster_url, instance)
    try:
        yield deployment
    finally:
        if deployment.process is not None:
            deployment.kill()
        instance.dispose()
        moto.stop()
        for name in names:
            drop_database(name)


def _runs(deployment: PlainDeployment, **filters: Any) -> list[dg.DagsterRun]:
    return list(deployment.instance.get_runs(dg.RunsFilter(**filters)))


def _first_flush_after(deployment: PlainDeployment, epoch_s: float) -> RunRecord:
    """The first flush run created after `epoch_s` that started (one launched before the append, for a row
    the kill left pending, may be the one that flushes it)."""
    created_after = datetime.fromtimestamp(epoch_s, UTC)
    records = deployment.instance.get_run_records(
        dg.RunsFilter(job_name="flush_wal", created_after=created_after)
    )
    return min((r for r in records if r.start_time is not None), key=lambda r: r.create_timestamp)


def _visible(deployment: PlainDeployment, dataset: str, seq: int) -> bool:
    return DatasetReader(deployment.aws("s3"), BUCKET, PREFIX, dataset).version >= seq


def _applied_once(deployment: PlainDeployment, dataset: str, versions: int) -> None:
    reader = DatasetReader(deployment.aws("s3"), BUCKET, PREFIX, dataset)
    covered = [seq for ref in reader.manifest().blobs() for seq in range(ref.first_seq, ref.last_seq + 1)]
    assert covered == list(range(1, versions + 1)), (dataset, covered)
    rows = WalTable(deployment.aws("dynamodb"), WAL_TABLE).query_rows(dataset)
    assert [row[t.STATUS_IDX]["S"].startswith(t.APPLIED_PREFIX) for row in rows] == [True] * versions


def _merging_up_to_the_cap(deployment: PlainDeployment) -> bool:
    """As many merge runs started as the Spark pool lets work at once (or one per merge shard)."""
    merging = _runs(deployment, job_name="merge_dataset_tables", statuses=[dg.DagsterRunStatus.STARTED])
    return len({run.tags.get("runstate/merge_shard") for run in merging}) >= min(SPARK_CAP, MERGE_SHARDS)


# In the deployment group: one deployment on these two cores at a time. Beside another (a restart test's
# daemon and its Spark merges), the restarted instance's first flush run took over a minute to launch.
@pytest.mark.xdist_group("deployment")
@pytest.mark.timeout(3600)
def test_a_plain_instance_runs_each_shard_once_at_a_time_and_its_killed_runs_end_after_a_restart(plain):
    """Issue 39.1: with only storage in dagster.yaml (no tag limits, Dagster's default launcher, no run
    monitoring), no shard is flushed or merged by two runs at once and every row is applied once; the
    deployment is then SIGKILLed mid-work (merges running, a flush run STARTING), and after the restart
    every run it left in progress is failed within 60 s, and a new row is visible within 60 s."""
    plain.start()
    producer = WalProducer(plain.aws("dynamodb"), WAL_TABLE)
    with Sampler(plain.dagster_db, lambda: plain.pid) as sampler:
        for dataset in DATASETS:
            producer.append(dataset, [Change.upsert("k", dataset)])
        poll(
            lambda: all(_visible(plain, dataset, 1) for dataset in DATASETS),
            timeout=900,
            every=2,
            what="100 datasets flushed",
        )
        # One merge run per merge shard follows (each a Spark JVM, at most SPARK_CAP at once): the sampler
        # counts them while they work. A run is STARTED well before its JVM is up (on a loaded host, the
        # kill below once came before any was): the wait ends once the sampler has seen one.
        poll(lambda: _merging_up_to_the_cap(plain), timeout=900, every=1, what="merges up to the Spark cap")
        poll(lambda: sampler.peaks.spark_jvms > 0, timeout=600, every=1, what="a merge run's Spark JVM")
        # A flush run killed while it launches: wait until no flush run lingers, then give its shard a row.
        poll(
            lambda: not _runs(plain, job_name="flush_wal", statuses=IN_PROGRESS_RUNS),
            timeout=600,
            every=1,
            what="the flush runs' linger over",
        )
        target = DATASETS[0]
        producer.append(target, [Change.upsert("k", "before the kill")])
        poll(
            lambda: _runs(plain, job_name="flush_wal", statuses=[dg.DagsterRunStatus.STARTING]),
            timeout=300,
            every=0.05,
            what="a flush run STARTING",
        )
        plain.kill()
        killed = _runs(plain, statuses=LAUNCHED_RUNS)

        # The restarted deployment merges hourly: the row's wait is its flush alone, not a CPU shared with
        # the four merges that the sensor would otherwise start again at once on these two cores.
        plain.env["RUNSTATE_DATASET_MERGE_INTERVAL_S"] = "3600"
        restarting = time.time()
        plain.start()
        appended = time.time()
        seq = producer.append(target, [Change.upsert("k", "after the restart")])
        poll(
            lambda: _visible(plain, target, seq),
            timeout=FLUSH_AFTER_RESTART_S,
            every=0.5,
            what=f"row {seq} of {target} visible after the restart",
        )
        visible_after = time.time() - appended
        flush = _first_flush_after(plain, restarting)
        check_flush_after_restart(
            "after the restart", appended, flush.create_timestamp.timestamp(), flush.start_time, visible_after
        )
        killed_ids = [run.run_id for run in killed]
        poll(
            lambda: not _runs(plain, run_ids=killed_ids, statuses=LAUNCHED_RUNS),
            timeout=max(1.0, RESTART_BOUND_S - (time.time() - appended)),
            every=0.5,
            what="every run the kill left in progress failed",
        )
        ended = [r.end_time for r in plain.instance.get_run_records(dg.RunsFilter(run_ids=killed_ids))]
        assert all(end is not None and end - appended <= RESTART_BOUND_S for end in ended), (
            f"the killed runs ended {[None if end is None else round(end - appended, 1) for end in ended]} s "
            "after the restart"
        )

    peaks = sampler.peaks
    print(
        f"plain instance: peak Spark JVMs {peaks.spark_jvms}, max runs per shard at once "
        f"{peaks.runs_per_shard} ({peaks.samples} samples), append-to-visible after a SIGKILL "
        f"restart {visible_after:.1f} s; the kill left {len(killed)} run(s) in progress: "
        + ", ".join(f"{run.job_name} {run.status.value}" for run in killed)
    )
    assert peaks.samples > 0 and peaks.runs_per_shard == 1, peaks.runs_per_shard_sample
    assert any(run.job_name == "flush_wal" and run.status == dg.DagsterRunStatus.STARTING for run in killed)
    for dataset in DATASETS[1:]:
        _applied_once(plain, dataset, 1)
    _applied_once(plain, target, seq)
    assert 0 < peaks.spark_jvms <= SPARK_CAP, peaks.spark_jvms
