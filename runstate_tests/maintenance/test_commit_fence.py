"""Fencing at the commit point and a job's next attempt after a crash, with real worker processes.

A worker process (its own JVM, kept across the tests as a worker run keeps it across jobs, so the
module's tests share one xdist group) claims a job and starts rewrite_data_files. A statement-level trigger
installed by the test holds that attempt's catalog UPDATE (its Iceberg commit) on an advisory lock the
test owns, before any row is locked: "paused just before the commit", deterministically. Then the test
stops (SIGSTOP) or kills (SIGKILL) the worker and runs its lease out in the database (the clock's part,
without waiting its 30 s: the worker cannot renew it either way).

The zombie test runs in two orders:
- B claims and completes, then A resumes (the order of the issue). A's commit is refused; here
  Iceberg's own validation would refuse it too, since B already replaced A's input files.
- A resumes once B holds the job's fence but before B commits: nothing but the commit fence stands
  between A and the table (without it, A's commit would land and the history show two rewrites).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from runstate.maintenance.commit_fence import schema_tag, worker_tag
from runstate.maintenance.runner import run_job
from runstate_tests.support.commit_fence import REACH_COMMIT_SECONDS
from runstate_tests.support.maintenance import (
    WorkerProcess,
    cache,
    make_table,
    rows,
    run_out_lease,
    snapshot_operations,
    sql,
    wait_for,
)

# A worker JVM starting on a loaded, shared machine can take minutes: more than the suite-wide 600 s.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800), pytest.mark.xdist_group("commit_fence")]
# Long: the tests end it themselves once the worker is stopped or dead (run_out_lease), so no loaded
# machine ends it early (10 s once ran out between claim and lock in a full suite: the attempt was fenced
# out before its commit, and the test waited for a hold that never came).
LEASE_SECONDS = 300.0


class WorkerJvm:
    """The module's worker process: started on first use, and again only after a test ended it."""

    def __init__(self, dsn: str, warehouse: Path) -> None:
        self.dsn, self.warehouse = dsn, warehouse
        self.current: WorkerProcess | None = None

    def get(self) -> WorkerProcess:
        if self.current is None or not self.current.alive:
            self.current = WorkerProcess(self.dsn, self.warehouse)
        return self.current

    def discard(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None


@pytest.fixture(scope="module")
def worker_jvm(pg_database: str, spark_settings) -> Iterator[WorkerJvm]:
    workers = WorkerJvm(pg_database, spark_settings.warehouse_dir)
    yield workers
    workers.discard()


@pytest.fixture
def worker_at_commit(rewrite_job, worker_jvm, commit_hold, pg_schema):
    """The worker process, having claimed the job and now waiting inside its Iceberg commit."""
    worker = worker_jvm.get()
    try:
        claim = worker.claim(pg_schema, LEASE_SECONDS)
        assert claim["job_id"] == rewrite_job[2]
        tag = worker_tag(pg_schema, claim["worker"])
        wait_for(
            lambda: commit_hold.waiting(tag), "the worker to reach its Iceberg commit", REACH_COMMIT_SECONDS
        )
        yield worker
    finally:
        if worker.running_a_job:  # a test that failed half-way: the next one gets a worker of its own
            worker_jvm.discard()


@pytest.mark.parametrize("b_commits_first", [True, False], ids=["B-completes-first", "A-resumes-first"])
def test_a_zombie_worker_cannot_commit_after_its_claim_was_taken_over(
    spark, store, rewrite_job, worker_at_commit, commit_hold, b_commits_first
):
    ref, before, job_id = rewrite_job
    worker_a = worker_at_commit
    worker_a.signal(signal.SIGSTOP)
    run_out_lease(store, job_id)  # A is stopped: it cannot renew
    claim_b = store.claim("worker-b", lease_seconds=300)  # B takes the job over
    assert claim_b is not None and claim_b.job_id == job_id
    commit_hold.let_through(worker_tag(store.schema, claim_b.worker))

    if b_commits_first:
        outcome_b = run_job(spark, store, claim_b)
    commit_hold.release()  # A's commit goes on now...
    worker_a.signal(signal.SIGCONT)
    outcome_a = worker_a.outcome()
    if not b_commits_first:
        outcome_b = run_job(spark, store, claim_b)

    # A's rewrite was refused: by the commit fence when it resumed first (its UPDATE would have matched),
    # by Iceberg's validation when B had already replaced its input files. Either way A wrote nothing.
    assert outcome_a["status"] == "fenced_out"
    assert outcome_b.status == "completed", outcome_b.error
    [record] = store.queue.job_actions(job_id)
    assert record.success and record.after["data_files"] == 1  # B's rewrite, recorded under B's fence
    assert snapshot_operations(spark, ref) == ["append", "replace"]  # only B's rewrite was committed
    assert rows(spark, ref) == before
    assert store.queue.get_job(job_id).attempt_id == claim_b.attempt_id


def test_a_killed_workers_next_attempt_takes_over_the_jobs_lock_and_completes(
    spark, store, rewrite_job, worker_at_commit, commit_hold, pg_database, pg_schema
):
    ref, before, job_id = rewrite_job
    worker_at_commit.signal(signal.SIGKILL)
    worker_at_commit.proc.wait(timeout=60)
    # The server notices a dead client only at its next read or write: end its session, as it would.
    sql(
        pg_database,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE %s",
        f"rsf:{schema_tag(pg_schema)}:%",
    )
    commit_hold.release()
    assert store.locks.table_lock(ref)["holder"] == job_id  # the dead attempt's lock is still there
    run_out_lease(store, job_id)

    second = store.claim("worker-2", lease_seconds=300)
    outcome = run_job(spark, store, second)

    assert second.job_id == job_id and second.attempt_count == 2
    assert outcome.status == "completed", outcome.error
    assert store.queue.get_job(job_id).status == "completed"
    assert snapshot_operations(spark, ref) == ["append", "replace"]
    assert rows(spark, ref) == before
    assert store.locks.table_lock(ref) is None


def test_writers_outside_maintenance_are_never_blocked_by_the_fence(spark, iceberg_namespace, store):
    ref = make_table(spark, iceberg_namespace, files=1, rows=10)
    cache(store, ref)
    assert store.ensure_commit_fence()
    job_id = store.submit(ref.database, ref.table, ["rewrite_data_files"])
    claim = store.claim("w", lease_seconds=300)
    assert store.locks.lock_for_claim(claim, 300) and store.locks.table_lock(ref)["holder"] == job_id

    spark.range(10, 20).selectExpr("id", "concat('v', id) AS v").writeTo(f"lake.{ref.quoted}").append()

    assert len(rows(spark, ref)) == 20
    assert store.locks.unlock_for_claim(claim)
