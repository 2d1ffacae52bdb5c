"""The data pipeline on a standalone Spark cluster: `spark://` master, two workers, two executors.

Every test asserts that its work ran as tasks on both executors (other JVMs and other Python workers
than the driver's): the blob reads in `mapInArrow` with the endpoint and credentials from the
configuration, the Iceberg jar shipped with `spark.jars`, the JDBC catalog and the commit fence.
The tests run in file order on one worker (an xdist group); the last two take the cluster down.
"""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from runstate.cli import main
from runstate.maintenance.commit_fence import worker_tag
from runstate.maintenance.runner import run_job
from runstate.services import spark_cluster
from runstate.services.state import free_port
from runstate.wal import DatasetReader
from runstate.wal.changes import Change
from runstate.wal.dataset_tables import BlobLocation, merge_dataset, read_table, table_ident
from runstate_tests.deployment.gate import process_of_client
from runstate_tests.support import maintenance
from runstate_tests.support.cluster import Executors
from runstate_tests.support.commit_fence import REACH_COMMIT_SECONDS
from runstate_tests.support.maintenance import table_location
from runstate_tests.support.wal import Feed, cli_on

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark_cluster"), pytest.mark.timeout(1800)]

# Long: the test ends it once the zombie is stopped (run_out_lease); on a loaded machine a zombie whose
# executors start slowly must not lose it before its rewrite begins (it would never reach the held commit).
ZOMBIE_LEASE_SECONDS = 300.0
ACTIONS = [
    "rewrite_data_files",
    "rewrite_position_delete_files",
    "rewrite_manifests",
    "expire_snapshots",
    "remove_orphan_files",
]


@pytest.fixture
def feed(wal) -> Feed:
    return Feed(wal)


@pytest.fixture
def cli(cluster, wal, spark_settings, dagster_home, monkeypatch) -> Iterator[CliRunner]:
    """The CLI on the test's WAL, the package's catalog and warehouse, and the cluster as its master."""
    yield from cli_on(monkeypatch, wal, spark_settings, RUNSTATE_SPARK_MASTER=cluster.url)


def _appended(feed: Feed, dataset_id: str, rounds: int, start: int = 0) -> int:
    """`rounds` WAL rows, each flushed into a delta blob of its own; returns the dataset's version."""
    version = 0
    for n in range(start, start + rounds):
        changes = [Change.upsert(f"k{i}", {"round": n, "i": i}) for i in range(40)]
        feed.append(dataset_id, [*changes, Change.delete(f"k{n}")])
        version = feed.flush(dataset_id)
    return version


def _invoke(cli: CliRunner, *args: str) -> str:
    result = cli.invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_a_dataset_merges_rebuilds_and_reads_back_on_the_cluster(cli, feed, dataset_ids, executors):
    dataset_id = dataset_ids("orders")
    assert _appended(feed, dataset_id, rounds=4) == 4

    before = executors.counts()
    merged = _invoke(cli, "wal", "merge", "--dataset", dataset_id)
    executors.wait_until_each_ran_tasks_since(before)
    blobs_at_4 = json.loads(_invoke(cli, "wal", "read", "--dataset", dataset_id))
    _appended(feed, dataset_id, rounds=2, start=4)
    before = executors.counts()
    rebuilt = _invoke(cli, "wal", "merge", "--dataset", dataset_id, "--rebuild")
    executors.wait_until_each_ran_tasks_since(before)

    assert f"lake.datasets.{dataset_id} at version 4" in merged
    assert f"lake.datasets.{dataset_id} at version 6" in rebuilt
    blobs = json.loads(_invoke(cli, "wal", "read", "--dataset", dataset_id))
    table = json.loads(_invoke(cli, "wal", "read", "--dataset", dataset_id, "--engine", "spark"))
    table_at_4 = _invoke(cli, "wal", "read", "--dataset", dataset_id, "--engine", "spark", "--version", "4")
    assert table == blobs and blobs["version"] == 6
    assert json.loads(table_at_4) == blobs_at_4 and blobs_at_4["version"] == 4


def test_one_maintenance_job_runs_every_action_on_the_executors(spark, iceberg_namespace, store, executors):
    ref = maintenance.make_table(spark, iceberg_namespace, files=8, rows=800, deletes=True)
    orphan = table_location(spark, ref) / "data" / "orphan-from-a-crashed-writer.parquet"
    orphan.write_bytes(b"not referenced by any snapshot")
    four_days_ago = time.time() - 4 * 24 * 3600
    os.utime(orphan, (four_days_ago, four_days_ago))
    maintenance.cache(store, ref)
    job_id = store.submit(
        ref.database, ref.table, ACTIONS, options={"expire_older_than_hours": 0, "retain_last": 1}
    )
    before_rows, before = maintenance.rows(spark, ref), executors.counts()

    outcome = run_job(spark, store, store.claim("cluster-worker", lease_seconds=300))

    executors.wait_until_each_ran_tasks_since(before)
    assert outcome.status == "completed", outcome.error
    assert sorted(r.action for r in store.queue.job_actions(job_id) if r.success) == sorted(ACTIONS)
    figures = {result.action: result.figures for result in outcome.results}
    assert figures["rewrite_data_files"]["rewritten_data_files_count"] == 8
    assert figures["remove_orphan_files"] == {"removed_orphan_files_count": 1}
    assert not orphan.exists()
    assert spark.table(f"lake.{ref.quoted}.data_files").count() == 1
    assert spark.table(f"lake.{ref.quoted}.delete_files").count() == 0
    assert spark.table(f"lake.{ref.quoted}.snapshots").count() == 1
    assert maintenance.rows(spark, ref) == before_rows


def test_the_commit_fence_refuses_a_zombie_whose_work_ran_on_executors(
    cluster, spark, spark_settings, store, rewrite_job, commit_hold, pg_database, pg_schema
):
    ref, before, job_id = rewrite_job
    ui_port = free_port()
    ui = {"spark.ui.enabled": "true", "spark.ui.port": str(ui_port)}
    zombie_spark = {"master": cluster.url, "extra_conf": ui}
    zombie = maintenance.WorkerProcess(pg_database, spark_settings.warehouse_dir, zombie_spark)
    try:
        claim_a = zombie.claim(pg_schema, ZOMBIE_LEASE_SECONDS)
        assert claim_a["job_id"] == job_id
        tag_a = worker_tag(pg_schema, claim_a["worker"])
        maintenance.wait_for(
            lambda: commit_hold.waiting(tag_a) or _has_output(zombie),
            "the zombie to reach its commit",
            REACH_COMMIT_SECONDS,
        )
        assert not _has_output(zombie), f"the zombie's job ended before its commit: {zombie.outcome()}"
        # Its rewrite ran as tasks on the cluster's executors, not in its driver. Six tiny files make one
        # read split, so one task on one executor: the figures around it are read in the driver.
        zombie_tasks = Executors(ui=f"http://127.0.0.1:{ui_port}").counts()
        assert sum(zombie_tasks.values()) > 0, zombie_tasks
        zombie.signal(signal.SIGSTOP)
        maintenance.run_out_lease(store, job_id)  # stopped, the zombie cannot renew it
        claim_b = store.claim("worker-b", lease_seconds=300)
        assert claim_b is not None and claim_b.job_id == job_id
        commit_hold.let_through(worker_tag(store.schema, claim_b.worker))

        # The zombie resumes while B holds the fence but before B commits: only the commit fence stops it.
        commit_hold.release()
        zombie.signal(signal.SIGCONT)
        outcome_a = zombie.outcome()
        outcome_b = run_job(spark, store, claim_b)
    finally:
        zombie.stop()

    assert outcome_a["status"] == "fenced_out"
    assert outcome_b.status == "completed", outcome_b.error
    assert maintenance.snapshot_operations(spark, ref) == [
        "append",
        "replace",
    ]  # only B's rewrite was committed
    assert maintenance.rows(spark, ref) == before


def test_a_worker_killed_in_the_middle_of_a_merge_costs_a_retry_never_half_a_table(
    cluster, spark, wal, feed, dataset_ids, gated_moto
):
    dataset_id = dataset_ids("killed")
    # The workers' environment has no AWS variables: the credentials travel with the configuration.
    location = BlobLocation(
        wal.bucket,
        wal.prefix,
        endpoint_url=wal.endpoint,
        access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
        secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
    )
    _appended(feed, dataset_id, rounds=1)
    merge_dataset(spark, location, dataset_id)  # the table exists (a dataset never flushed gets none)
    ident = table_ident(dataset_id)
    snapshots_before = spark.table(f"{ident}.snapshots").count()
    version = _appended(feed, dataset_id, rounds=4, start=1)
    blob_reads = f"/{wal.prefix}{dataset_id}/delta/"
    gated_moto.gate.arm(
        lambda environ, _: environ["REQUEST_METHOD"] == "GET" and blob_reads in environ["PATH_INFO"]
    )

    outcome: dict[str, object] = {}
    merging = threading.Thread(target=_merge_into, args=(outcome, spark, location, dataset_id))
    merging.start()
    try:
        # Both executors are inside a task, each holding a blob read: the merge is half done.
        maintenance.wait_for(
            lambda: len(gated_moto.gate.held_client_ports) >= 2, "a blob read on each executor", 600
        )
        reader_pid = process_of_client(gated_moto.gate.held_client_ports[0], gated_moto.port)
        victim = cluster.worker_of(reader_pid)
        assert victim is not None, f"process {reader_pid} is in no worker's session"
        cluster.kill_worker(victim)  # SIGKILL to the worker, its executor and its Python workers
    finally:
        gated_moto.gate.disarm()  # the surviving reader's request fails with 503, and boto3 retries it
        merging.join(timeout=900)

    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].version == version
    assert read_table(spark, dataset_id) == (
        version,
        DatasetReader(wal.s3, wal.bucket, wal.prefix, dataset_id).state(),
    )
    assert spark.table(f"{ident}.snapshots").count() == snapshots_before + 1  # one commit: all or nothing


def _has_output(worker: maintenance.WorkerProcess) -> bool:
    """Whether the worker printed a line not read yet (its job's outcome)."""
    return bool(select.select([worker.proc.stdout.fileno()], [], [], 0)[0])


def _merge_into(outcome: dict[str, object], spark, location: BlobLocation, dataset_id: str) -> None:
    try:
        outcome["result"] = merge_dataset(spark, location, dataset_id)
    except Exception as error:  # noqa: BLE001 - the test reports it
        outcome["error"] = error


def test_down_stops_every_daemon_with_its_executors_and_python_workers(cluster, spark):
    sessions = [record.pid for record in cluster.records().values() if record.pid]
    executor_jvms = [
        pid for sid in sessions for pid in spark_cluster.session_members(sid) if _is_executor(pid)
    ]
    assert executor_jvms, "the package's executors run inside the workers' sessions"

    stopped = spark_cluster.down()

    assert spark_cluster.MASTER in stopped and spark_cluster.load_cluster() is None
    assert [pid for sid in sessions for pid in spark_cluster.session_members(sid)] == []


def _is_executor(pid: int) -> bool:
    try:
        return b"CoarseGrainedExecutorBackend" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
