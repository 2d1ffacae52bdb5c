"""A worker drains the queue on one Spark session: each job keeps its own fence, lock and records."""

from __future__ import annotations

import pytest

from runstate.maintenance.runner import work_queue
from runstate_tests.maintenance.conftest import cache, make_table

pytestmark = pytest.mark.spark


def test_one_worker_drains_every_queued_job_on_one_session(spark, iceberg_namespace, store):
    refs = [make_table(spark, iceberg_namespace, f"t{i}", files=5, rows=50) for i in range(3)]
    cache(store, *refs)
    jobs = [store.submit(ref.database, ref.table, ["rewrite_data_files"]) for ref in refs]
    sessions = []

    def session():
        sessions.append(spark)
        return spark

    report = work_queue(session, store, "worker-1", lease_seconds=120, budget_seconds=600)

    assert [o.status for o in report.outcomes] == ["completed"] * 3
    assert len({o.attempt_id for o in report.outcomes}) == 3  # one fence per job
    for job_id in jobs:
        [record] = store.job_actions(job_id)
        assert record.success and (record.before["data_files"], record.after["data_files"]) == (5, 1)
        assert store.get_job(job_id).status == "completed"
    assert all(store.table_lock(ref.key) is None for ref in refs)
    assert store.queue_depth() == (0, 0)


def test_a_spent_budget_stops_claiming_and_an_empty_queue_never_starts_spark(store):
    def no_spark():
        raise AssertionError("Spark must not start without a claimed job")

    report = work_queue(no_spark, store, "worker-1", lease_seconds=120, budget_seconds=0)
    empty = work_queue(no_spark, store, "worker-1", lease_seconds=120, budget_seconds=600)

    assert report.outcomes == [] and empty.outcomes == []
