"""A worker drains the queue on one Spark session: each job keeps its own fence, lock and records."""

from __future__ import annotations

from contextlib import closing

import pytest

from runstate.maintenance.commit_fence import worker_tag
from runstate.maintenance.models import CachedTable
from runstate.maintenance.runner import QueueWorker
from runstate_tests.support.maintenance import cache, make_table, sql, store_sql, wait_for

pytestmark = pytest.mark.spark


def test_one_worker_drains_every_queued_job_on_one_session(spark, iceberg_namespace, store):
    refs = [make_table(spark, iceberg_namespace, f"t{i}", files=5, rows=50) for i in range(3)]
    cache(store, *refs)
    jobs = [store.submit(ref.database, ref.table, ["rewrite_data_files"]) for ref in refs]
    sessions = []

    def session():
        sessions.append(spark)
        return spark

    report = QueueWorker(store, "worker-1", lease_seconds=120).drain(session, budget_seconds=600)

    assert [o.status for o in report.outcomes] == ["completed"] * 3
    assert len({o.attempt_id for o in report.outcomes}) == 3  # one fence per job
    for job_id in jobs:
        [record] = store.queue.job_actions(job_id)
        assert record.success and (record.before["data_files"], record.after["data_files"]) == (5, 1)
        assert store.queue.get_job(job_id).status == "completed"
    assert all(store.locks.table_lock(ref) is None for ref in refs)
    assert store.queue.queue_depth() == (0, 0)


def test_a_workers_session_sees_each_table_as_it_is_when_a_job_starts_and_closes_its_connections(
    spark, iceberg_namespace, store
):
    ref = make_table(spark, iceberg_namespace, "t", files=5, rows=50)
    cache(store, ref)
    first = store.submit(ref.database, ref.table, ["rewrite_data_files"])
    jobs, files = [first], [5]

    worker = QueueWorker(store, "worker-1", lease_seconds=120)

    for outcome in worker.run(spark, budget_seconds=600):
        # Between two jobs of one session, a writer outside maintenance adds four files.
        if outcome.job_id == first:
            spark.range(40).selectExpr("id", "'x' AS v").repartition(4).writeTo(f"lake.{ref.quoted}").append()
            files.append(spark.table(f"lake.{ref.quoted}.files").count())
            jobs.append(store.submit(ref.database, ref.table, ["rewrite_data_files"]))

    assert [o.status for o in worker.report.outcomes] == ["completed"] * 2
    figures = [store.queue.job_actions(job_id)[0] for job_id in jobs]
    assert [(r.before["data_files"], r.after["data_files"]) for r in figures] == [
        (files[0], 1),
        (files[1], 1),
    ]
    assert files[1] >= 5  # enough small files for a rewrite
    tag = worker_tag(store.schema, "worker-1")
    count = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
    wait_for(lambda: sql(store.dsn, count, tag) == [(0,)], "the worker session's connections to close", 60)


def test_a_spent_budget_stops_claiming_and_an_empty_queue_never_starts_spark(store):
    def no_spark():
        raise AssertionError("Spark must not start without a claimed job")

    report = QueueWorker(store, "worker-1", lease_seconds=120).drain(no_spark, budget_seconds=0)
    empty = QueueWorker(store, "worker-1", lease_seconds=120).drain(no_spark, budget_seconds=600)

    assert report.outcomes == [] and empty.outcomes == []


def test_a_worker_claims_only_when_its_caller_asks_for_the_next_outcome(store):
    store.cache.replace_table_cache([CachedTable("db", f"t{i}", True, {}) for i in range(2)])
    jobs = [store.submit("db", f"t{i}", ["rewrite_manifests"]) for i in range(2)]

    def no_spark():
        raise AssertionError("Spark must not start when no job is asked for")

    # A caller told to stop before its first job asks for none: closing the run claims nothing.
    with closing(QueueWorker(store, "worker-1", lease_seconds=120).run(no_spark, budget_seconds=600)):
        pass

    assert [store.queue.get_job(job_id).status for job_id in jobs] == ["pending", "pending"]
    assert store.queue.queue_depth() == (2, 2)


def test_a_caller_that_stops_after_one_job_leaves_the_rest_queued_and_the_session_closed(
    spark, iceberg_namespace, store
):
    refs = [make_table(spark, iceberg_namespace, f"s{i}", files=2, rows=20) for i in range(2)]
    cache(store, *refs)
    jobs = [store.submit(ref.database, ref.table, ["rewrite_manifests"]) for ref in refs]
    worker = QueueWorker(store, "worker-2", lease_seconds=120)

    with closing(worker.run(spark, budget_seconds=600)) as outcomes:
        first = next(outcomes)  # then told to stop: it asks for no more

    assert (first.job_id, first.ref, first.status) == (jobs[0], refs[0], "completed")
    assert worker.report.outcomes == [first]
    assert store.queue.get_job(jobs[1]).status == "pending"
    tag = worker_tag(store.schema, "worker-2")
    count = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
    wait_for(lambda: sql(store.dsn, count, tag) == [(0,)], "the worker session's connections to close", 60)


def test_a_job_whose_stored_options_no_longer_validate_fails_once_with_a_clear_error(
    spark, iceberg_namespace, store
):
    # A row written before submit checked options (or edited by hand): the worker must fail the job, not
    # crash its run on every attempt.
    ref = make_table(spark, iceberg_namespace, "t", files=2, rows=10)
    cache(store, ref)
    job_id = store.submit(ref.database, ref.table, ["rewrite_data_files"])
    store_sql(store, "UPDATE jobs SET options = '{\"k\": 1}'::jsonb WHERE job_id = %s", job_id)

    report = QueueWorker(store, "worker-1", lease_seconds=120).drain(spark, budget_seconds=600)

    [outcome] = report.outcomes
    assert outcome.status == "failed" and "stored options are invalid" in outcome.error
    assert "unknown maintenance option" in outcome.error
    job = store.queue.get_job(job_id)
    assert job.status == "failed" and store.queue.job_actions(job_id) == []
