"""MaintenanceStore's queue after the claim, on a real Postgres: fencing, leases, attempts, completion,
cancel, delete, and the store's connections (submit and claims: test_store_queue.py).

A lease "expires" by moving its deadline into the past in the database (the same effect as waiting
out the lease, without a sleep); one test lets a short lease run out for real.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from runstate.datastore.postgres import CHECK_AFTER_IDLE_SECONDS
from runstate.maintenance import (
    CachedTable,
    Claim,
    InvalidStatus,
    JobNotFound,
    MaintenanceStore,
    TableRef,
    UnknownAction,
)
from runstate_tests.support.maintenance import job_rows, queue_store, run_out_lease
from runstate_tests.support.maintenance import store_sql as _sql


@pytest.fixture
def store(pg_database: str, pg_schema: str) -> Iterator[MaintenanceStore]:
    with queue_store(pg_database, pg_schema) as maintenance:
        yield maintenance


# ------------------------------------------------------------------------------------------ fencing


def test_fenced_out_worker_changes_nothing_and_the_new_claimant_completes(store: MaintenanceStore) -> None:
    job_id = store.submit("db", "t0", ["rewrite_data_files", "expire_snapshots"])
    old = store.claim("old-worker", 30)
    assert old is not None and store.queue.record_action(old, "rewrite_data_files", True, "rewrote 10 files")
    run_out_lease(store, job_id)
    new = store.claim("new-worker", 30)
    assert new is not None and new.job_id == job_id and new.attempt_count == 2
    before = job_rows(store, job_id)

    assert store.heartbeat(old) is False
    assert store.queue.record_action(old, "expire_snapshots", True, "expired 3") is False
    assert store.complete(old, "completed") is False
    assert store.complete(old, "failed", "late failure") is False
    assert job_rows(store, job_id) == before

    assert store.heartbeat(new) is True
    assert store.queue.record_action(new, "rewrite_data_files", True, "rewrote 0 files")
    assert store.complete(new, "completed")
    job = store.queue.get_job(job_id)
    assert job is not None and (job.status, job.attempt_id, job.error) == ("completed", new.attempt_id, None)
    assert _sql(store, "SELECT count(*) FROM job_queue") == [(0,)]


def test_worker_whose_lease_expired_cannot_complete_even_unclaimed(store: MaintenanceStore) -> None:
    job_id = store.submit("db", "t0", ["rewrite_data_files"])
    claim = store.claim("w", 30)
    assert claim is not None
    run_out_lease(store, job_id)
    assert store.heartbeat(claim) is False
    assert store.complete(claim, "completed") is False
    assert store.queue.get_job(job_id).status == "running"  # type: ignore[union-attr]
    again = store.claim("w2", 30)
    assert again is not None and again.job_id == job_id


def test_a_short_lease_really_runs_out(store: MaintenanceStore) -> None:
    job_id = store.submit("db", "t0", ["rewrite_data_files"])
    claim = store.claim("w", 0.05)
    assert claim is not None
    _sql(store, "SELECT pg_sleep(0.1)")  # wait out the 50 ms lease on the database's clock
    again = store.claim("w2", 30)
    assert again is not None and again.job_id == job_id
    assert store.complete(claim, "completed") is False
    assert store.complete(again, "completed") is True


def test_a_zero_lease_is_expired_at_once(store: MaintenanceStore) -> None:
    job_id = store.submit("db", "t0", ["rewrite_data_files"])
    first = store.claim("a", 0)
    second = store.claim("b", 30)
    assert first is not None and second is not None and second.job_id == first.job_id == job_id
    assert store.complete(first, "completed") is False
    assert store.complete(second, "completed") is True


def test_heartbeat_extends_the_lease(store: MaintenanceStore) -> None:
    store.submit("db", "t0", ["rewrite_data_files"])
    claim = store.claim("w", 5)
    assert claim is not None
    assert store.heartbeat(claim, 600)
    [(remaining,)] = _sql(store, "SELECT extract(epoch FROM visible_at - now()) FROM job_queue")
    assert float(remaining) > 500


def test_killed_worker_job_is_reclaimed_and_completed(store: MaintenanceStore) -> None:
    job_id = store.submit("db", "t0", ["rewrite_data_files"])
    script = (
        "import sys, time\n"
        "from runstate.maintenance import MaintenanceStore\n"
        "store = MaintenanceStore(sys.argv[1], schema=sys.argv[2])\n"
        "claim = store.claim('doomed', 30)\n"
        "store.queue.record_action(claim, 'rewrite_data_files', False, '', 'interrupted', 0.1)\n"
        "print(claim.attempt_id, flush=True)\n"
        "time.sleep(600)\n"
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", script, store.dsn, store.schema], stdout=subprocess.PIPE, text=True
    )
    doomed_attempt = worker.stdout.readline().strip()  # type: ignore[union-attr]
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=30)
    assert store.claim("survivor", 30) is None  # its lease is still live
    run_out_lease(store, job_id)
    claim = store.claim("survivor", 30)
    assert claim is not None and claim.job_id == job_id and claim.attempt_id != doomed_attempt
    assert claim.attempt_count == 2
    assert store.complete(claim, "completed")
    assert [a.error for a in store.queue.job_actions(job_id)] == ["interrupted"]


def test_job_fails_with_a_clear_error_after_max_attempts(pg_database: str, pg_schema: str) -> None:
    with MaintenanceStore(pg_database, schema=pg_schema, max_attempts=2) as store:
        store.ensure_schema()
        store.cache.replace_table_cache([CachedTable("db", "t0")])
        job_id = store.submit("db", "t0", ["rewrite_data_files"])
        for attempt in (1, 2):
            claim = store.claim(f"w{attempt}", 30)
            assert claim is not None and claim.attempt_count == attempt
            run_out_lease(store, job_id)
        assert store.claim("w3", 30) is None
        job = store.queue.get_job(job_id)
        assert job is not None and job.status == "failed" and job.completed_at is not None
        assert "gave up after 2 attempts" in job.error and "w2" in job.error and "db.t0" in job.error
        assert _sql(store, "SELECT count(*) FROM job_queue") == [(0,)]


def test_sweep_requeues_expired_leases_and_fails_exhausted_ones(pg_database: str, pg_schema: str) -> None:
    with MaintenanceStore(pg_database, schema=pg_schema, max_attempts=2) as store:
        store.ensure_schema()
        store.cache.replace_table_cache(
            [CachedTable("db", "a"), CachedTable("db", "b"), CachedTable("db", "c")]
        )
        retry = store.submit("db", "a", ["rewrite_data_files"])
        exhausted = store.submit("db", "b", ["rewrite_data_files"])
        live = store.submit("db", "c", ["rewrite_data_files"])
        assert {store.claim("w", 30).job_id for _ in range(3)} == {retry, exhausted, live}  # type: ignore[union-attr]
        run_out_lease(store, retry)  # attempt 1 of 2 ran out: back to pending
        # attempt 2 of 2 ran out: nothing left
        _sql(
            store,
            "UPDATE job_queue SET attempt_count = 2, visible_at = now() - interval '1 s' WHERE job_id = %s",
            exhausted,
        )

        assert store.queue.sweep_stale_claims() == 2
        assert _sql(store, "SELECT status, attempt_id FROM jobs WHERE job_id = %s", retry) == [
            ("pending", None)
        ]
        assert _sql(
            store, "SELECT claimed_at, claimed_by, attempt_id FROM job_queue WHERE job_id = %s", retry
        ) == [(None, None, None)]
        assert store.queue.get_job(exhausted).status == "failed"  # type: ignore[union-attr]
        assert store.queue.get_job(live).status == "running"  # type: ignore[union-attr]
        assert store.queue.sweep_stale_claims() == 0


# --------------------------------------------------------------------------------------- completion


def test_complete_is_retry_safe_and_validates_status(store: MaintenanceStore) -> None:
    store.submit("db", "t0", ["rewrite_data_files"])
    claim = store.claim("w", 30)
    assert claim is not None
    with pytest.raises(InvalidStatus):
        store.complete(claim, "done")
    assert store.complete(claim, "failed", "spark said no")
    assert store.complete(claim, "failed", "spark said no")  # a retried ack after a lost reply
    assert store.complete(claim, "completed") is False  # not a different outcome
    job = store.queue.get_job(claim.job_id)
    assert job is not None and (job.status, job.error) == ("failed", "spark said no")


def test_record_action_is_fenced_and_written_once_per_attempt(store: MaintenanceStore) -> None:
    store.submit("db", "t0", ["rewrite_data_files"])
    claim = store.claim("w", 30)
    assert claim is not None
    assert store.queue.record_action(claim, "rewrite_data_files", True, "rewritten 40 -> 1", None, 1.5)
    assert store.queue.record_action(claim, "rewrite_data_files", True, "rewritten 40 -> 1", None, 1.5)
    with pytest.raises(UnknownAction):
        store.queue.record_action(claim, "vacuum", True)
    [record] = store.queue.job_actions(claim.job_id)
    assert (record.action, record.success, record.message, record.elapsed_seconds) == (
        "rewrite_data_files",
        True,
        "rewritten 40 -> 1",
        1.5,
    )


def test_forged_claim_is_fenced_out(store: MaintenanceStore) -> None:
    store.submit("db", "t0", ["rewrite_data_files"])
    real = store.claim("w", 30)
    assert real is not None
    forged = Claim(**{**real.__dict__, "attempt_id": "not-the-fence"})
    assert store.heartbeat(forged) is False
    assert store.queue.record_action(forged, "rewrite_data_files", True) is False
    assert store.complete(forged, "completed") is False
    assert store.queue.get_job(real.job_id).status == "running"  # type: ignore[union-attr]


# -------------------------------------------------------------------------------------------- cancel


def test_cancel_pending_job(store: MaintenanceStore) -> None:
    job_id = store.submit("db", "t0", ["rewrite_data_files"])
    assert store.cancel(job_id) == "cancelled"
    job = store.queue.get_job(job_id)
    assert job is not None and job.status == "cancelled" and job.completed_at is not None
    assert store.claim("w", 30) is None
    assert store.cancel(job_id) == "cancelled"


def test_cancel_running_job_is_seen_by_the_worker_which_completes_as_cancelled(
    store: MaintenanceStore,
) -> None:
    job_id = store.submit("db", "t0", ["rewrite_data_files", "expire_snapshots"])
    claim = store.claim("w", 30)
    assert claim is not None
    assert store.queue.record_action(claim, "rewrite_data_files", True, "done")
    assert store.queue.is_cancel_requested(claim) is False

    assert store.cancel(job_id) == "cancel_requested"
    job = store.queue.get_job(job_id)
    assert job is not None and job.cancel_requested and job.completed_at is None
    assert store.queue.is_cancel_requested(claim) is True
    assert store.heartbeat(claim) is True  # still its job until it acknowledges
    assert store.complete(claim, "cancelled")
    job = store.queue.get_job(job_id)
    assert job is not None and job.status == "cancelled" and job.completed_at is not None
    assert not job.cancel_requested
    assert [a.action for a in store.queue.job_actions(job_id)] == ["rewrite_data_files"]


def test_cancelled_job_whose_worker_died_is_finished_by_the_sweep(store: MaintenanceStore) -> None:
    job_id = store.submit("db", "t0", ["rewrite_data_files"])
    claim = store.claim("w", 30)
    assert claim is not None
    assert store.cancel(job_id) == "cancel_requested"
    run_out_lease(store, job_id)
    assert store.claim("w2", 30) is None  # a cancelled job is never handed out again
    assert store.queue.sweep_stale_claims() == 0  # the claim above already finished it
    job = store.queue.get_job(job_id)
    assert job is not None and job.status == "cancelled" and job.completed_at is not None
    assert _sql(store, "SELECT count(*) FROM job_queue") == [(0,)]


def test_cancel_of_unknown_or_finished_jobs(store: MaintenanceStore) -> None:
    with pytest.raises(JobNotFound):
        store.cancel("no-such-job")
    job_id = store.submit("db", "t0", ["rewrite_data_files"])
    claim = store.claim("w", 30)
    assert claim is not None and store.complete(claim, "completed")
    assert store.cancel(job_id) == "completed"
    assert store.queue.get_job(job_id).status == "completed"  # type: ignore[union-attr]


def test_soft_delete_cancels_and_hides_the_job(store: MaintenanceStore) -> None:
    job_id = store.submit("db", "t0", ["rewrite_data_files"])
    assert store.queue.soft_delete(job_id) is True
    assert store.queue.soft_delete(job_id) is False
    job = store.queue.get_job(job_id)
    assert job is not None and job.deleted_at is not None and job.status == "cancelled"
    assert store.queue.list_jobs() == []
    assert store.queue.active_job(TableRef("db", "t0")) is None
    assert store.submit("db", "t0", ["rewrite_data_files"]) != job_id


def test_list_jobs_filters(store: MaintenanceStore) -> None:
    a = store.submit("db", "t0", ["rewrite_data_files"])
    b = store.submit("db", "t1", ["rewrite_data_files"])
    claim = store.claim("w", 30)
    assert claim is not None and store.complete(claim, "completed")
    assert [j.job_id for j in store.queue.list_jobs(table=TableRef("db", "t1"))] == [b]
    assert [j.job_id for j in store.queue.list_jobs(status="completed")] == [claim.job_id]
    assert {j.job_id for j in store.queue.list_jobs()} == {a, b}
    with pytest.raises(InvalidStatus):
        store.queue.list_jobs(status="weird")


def test_cancels_racing_claims_leave_every_job_in_one_final_state(store: MaintenanceStore) -> None:
    store.cache.replace_table_cache([CachedTable("db", f"r{i}") for i in range(60)])
    job_ids = [store.submit("db", f"r{i}", ["rewrite_manifests"]) for i in range(60)]
    barrier = threading.Barrier(3)
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        barrier.wait()
        try:
            while (claim := store.claim(name, 60)) is not None:
                status = "cancelled" if store.queue.is_cancel_requested(claim) else "completed"
                assert store.complete(claim, status)
        except BaseException as exc:  # surfaced below: a deadlock or a fence error fails the test
            errors.append(exc)

    def canceller() -> None:
        barrier.wait()
        try:
            for job_id in job_ids[::2]:
                store.cancel(job_id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(2)] + [
        threading.Thread(target=canceller)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    store.queue.sweep_stale_claims()
    final = dict(_sql(store, "SELECT job_id, status FROM jobs WHERE completed_at IS NOT NULL"))
    assert set(final) == set(job_ids)
    assert {final[job_id] for job_id in job_ids[1::2]} == {"completed"}
    assert set(final.values()) <= {"completed", "cancelled"}
    assert _sql(store, "SELECT count(*) FROM job_queue") == [(0,)]


def test_nul_in_spark_messages_is_stored_not_refused(store: MaintenanceStore) -> None:
    store.submit("db", "t0", ["rewrite_data_files"])
    claim = store.claim("w", 30)
    assert claim is not None
    assert store.queue.record_action(claim, "rewrite_data_files", False, "out\x00put", "boom\x00", 0.1)
    assert store.complete(claim, "failed", "java said \x00")
    [record] = store.queue.job_actions(claim.job_id)
    assert (record.message, record.error) == ("out\\0put", "boom\\0")


def test_store_reconnects_after_its_backend_is_killed(store: MaintenanceStore) -> None:
    job_id = store.submit("db", "t0", ["rewrite_data_files"])
    claim = store.claim("w", 30)
    assert claim is not None
    # Every pooled session of the store, the one the next call would use among them.
    pids = _sql(
        store,
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'runstate-maintenance'"
        " AND datname = current_database() AND pid <> pg_backend_pid()",
    )
    for (pid,) in pids:
        assert _sql(store, "SELECT pg_terminate_backend(%s, 10000)", pid) == [(True,)]  # waits until gone
    # The pool checks a connection idle for a while when it hands it out: a dead one is replaced.
    time.sleep(CHECK_AFTER_IDLE_SECONDS)  # a lower bound, not a race: idle at least this long
    assert store.heartbeat(claim) is True
    assert store.complete(claim, "completed")
    assert store.queue.get_job(job_id).status == "completed"  # type: ignore[union-attr]


def test_a_connection_is_back_in_the_pool_when_the_call_returns(store: MaintenanceStore) -> None:
    # Returned inline, not handed to a pool thread (psycopg_pool does that when a `reset` callback is
    # set): then a caller's next call found the pool empty, waited for the handoff, and the pool grew
    # to its maximum; that halved the queue's throughput with 4 workers.
    pool = store.db.datastore._get_pool()
    pool.wait()  # its first connection is made in the background
    for _ in range(20):
        assert store.queue.queue_depth() == (0, 0)
        stats = pool.get_stats()
        assert stats["pool_available"] == stats["pool_size"]
