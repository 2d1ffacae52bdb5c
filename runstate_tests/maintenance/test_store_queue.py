"""MaintenanceStore's queue on a real Postgres: submit (validated before any SQL, atomic, one job per
table) and fenced claims, from threads and processes racing (after the claim:
test_store_queue_lifecycle.py)."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator

import psycopg
import pytest

from runstate.maintenance import (
    CachedTable,
    InvalidActionOption,
    InvalidIdentifier,
    MaintenanceStore,
    StoreError,
    StoreUnavailable,
    TableNotCached,
    TableRef,
    UnknownAction,
)
from runstate_tests.support.maintenance import queue_store, run_out_lease
from runstate_tests.support.maintenance import store_sql as _sql
from runstate_tests.support.races import racing_processes

UNREACHABLE_DSN = "postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=2"


@pytest.fixture
def store(pg_database: str, pg_schema: str) -> Iterator[MaintenanceStore]:
    with queue_store(pg_database, pg_schema) as maintenance:
        yield maintenance


# ------------------------------------------------------------------------------------------ submit

BAD_SUBMITS = [
    ("db", "t'; DROP TABLE jobs; --", ["rewrite_data_files"]),
    ("db", 't"', ["rewrite_data_files"]),
    ("db;", "t", ["rewrite_data_files"]),
    ("db", "t x", ["rewrite_data_files"]),
    ("db", " t", ["rewrite_data_files"]),
    ("d.b", "t", ["rewrite_data_files"]),
    ("db", "t.u", ["rewrite_data_files"]),
    ("db", "t\x00", ["rewrite_data_files"]),
    ("db", "t\n", ["rewrite_data_files"]),
    ("", "t", ["rewrite_data_files"]),
    ("db", "", ["rewrite_data_files"]),
    ("db", "t" * 129, ["rewrite_data_files"]),
    ("db", "t0", ["vacuum"]),
    ("db", "t0", []),
    ("db", "t0", ["rewrite_data_files; DROP TABLE jobs"]),
]


@pytest.mark.parametrize("database, table, actions", BAD_SUBMITS)
def test_bad_submit_is_rejected_before_any_sql(database: str, table: str, actions: list[str]) -> None:
    # The DSN cannot connect: reaching SQL would raise OperationalError instead of the validation error.
    store = MaintenanceStore(UNREACHABLE_DSN)
    with pytest.raises((InvalidIdentifier, UnknownAction)):
        store.submit(database, table, actions)


def test_unreachable_dsn_does_fail_once_input_is_valid() -> None:
    with pytest.raises(StoreUnavailable, match="cannot connect") as raised:
        MaintenanceStore(UNREACHABLE_DSN).submit("db", "t0", ["rewrite_data_files"])
    assert isinstance(raised.value.__cause__, psycopg.OperationalError)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"dry_run": "yes"},
        {"options": {"when": object()}},
        {"options": ["a"]},
        {"options": {"retain_last": 0}},
        {"options": {"k": 1}},
    ],
)
def test_bad_dry_run_or_options_are_rejected_before_any_sql(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        MaintenanceStore(UNREACHABLE_DSN).submit("db", "t0", ["rewrite_data_files"], **kwargs)


def test_rejected_submits_write_nothing(store: MaintenanceStore) -> None:
    for database, table, actions in BAD_SUBMITS:
        with pytest.raises(ValueError):
            store.submit(database, table, actions)
    assert _sql(store, "SELECT count(*) FROM jobs") == [(0,)]
    assert _sql(store, "SELECT count(*) FROM job_queue") == [(0,)]


def test_submit_requires_the_table_in_the_cache(store: MaintenanceStore) -> None:
    with pytest.raises(TableNotCached, match="'db.unknown'"):
        store.submit("db", "unknown", ["rewrite_data_files"])
    assert _sql(store, "SELECT count(*) FROM jobs") == [(0,)]


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"rewrite_strategy": "sort", "sort_order": "id; DROP"}, "sort_order term"),
        ({"sort_order": "id"}, "needs rewrite_strategy 'sort'"),
        ({"strategy": "sort"}, "unknown maintenance option"),
    ],
)
def test_bad_job_options_are_refused_and_nothing_is_queued(
    store: MaintenanceStore, options, fragment
) -> None:
    with pytest.raises(InvalidActionOption, match=fragment):
        store.submit("db", "t0", ["rewrite_data_files"], options=options)
    assert _sql(store, "SELECT count(*) FROM jobs") == [(0,)]


def test_submit_writes_job_and_queue_row(store: MaintenanceStore) -> None:
    job_id = store.submit(
        "db", "t0", ["expire_snapshots", "rewrite_data_files"], dry_run=True, options={"retain_last": 1}
    )
    job = store.queue.get_job(job_id)
    assert job is not None
    assert (job.status, job.actions, job.dry_run, job.options) == (
        "pending",
        ("rewrite_data_files", "expire_snapshots"),
        True,
        {"retain_last": 1},
    )
    assert _sql(store, "SELECT claimed_at, attempt_count, visible_at <= now() FROM job_queue") == [
        (None, 0, True)
    ]


def test_submit_is_atomic_when_the_queue_insert_fails(store: MaintenanceStore) -> None:
    # A real failure inside the transaction: a trigger makes the job_queue insert raise.
    _sql(
        store,
        "CREATE FUNCTION refuse_enqueue() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN RAISE EXCEPTION 'queue is read-only'; END $$",
    )
    _sql(
        store,
        "CREATE TRIGGER refuse BEFORE INSERT ON job_queue FOR EACH ROW EXECUTE FUNCTION refuse_enqueue()",
    )
    with pytest.raises(StoreError, match="queue is read-only") as raised:
        store.submit("db", "t0", ["rewrite_data_files"])
    assert isinstance(raised.value.__cause__, psycopg.errors.RaiseException)
    assert _sql(store, "SELECT count(*) FROM jobs") == [(0,)]
    _sql(store, "DROP TRIGGER refuse ON job_queue")
    job_id = store.submit("db", "t0", ["rewrite_data_files"])  # the retry goes through, once
    assert _sql(store, "SELECT job_id FROM jobs") == [(job_id,)]


def test_second_submit_for_an_active_table_returns_the_existing_job(store: MaintenanceStore) -> None:
    first = store.submit("db", "t0", ["rewrite_data_files"])
    assert store.submit("db", "t0", ["expire_snapshots"]) == first
    claim = store.claim("w1", 60)
    assert claim is not None and claim.job_id == first
    assert store.submit("db", "t0", ["expire_snapshots"]) == first  # running counts as active too
    assert store.complete(claim, "completed")
    assert store.submit("db", "t0", ["expire_snapshots"]) != first
    assert _sql(store, "SELECT count(*) FROM jobs") == [(2,)]


def test_concurrent_submits_for_one_table_make_one_job(store: MaintenanceStore) -> None:
    barrier = threading.Barrier(8)
    ids: list[str] = []

    def submit() -> None:
        barrier.wait()
        ids.append(store.submit("db", "t1", ["rewrite_data_files"]))

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ids) == 8 and len(set(ids)) == 1
    assert _sql(store, "SELECT count(*) FROM jobs") == [(1,)]
    assert _sql(store, "SELECT count(*) FROM job_queue") == [(1,)]


# ------------------------------------------------------------------------------------------- claim


def test_claim_sets_the_fence_on_both_rows_and_the_lease(store: MaintenanceStore) -> None:
    job_id = store.submit("db", "t0", ["rewrite_data_files"], options={"rewrite_strategy": "sort"})
    claim = store.claim("worker-a", 90)
    assert claim is not None
    assert (claim.job_id, claim.ref, claim.plan.actions, claim.attempt_count) == (
        job_id,
        TableRef("db", "t0"),
        ("rewrite_data_files",),
        1,
    )
    assert claim.plan.options == {"rewrite_strategy": "sort"}
    [(job_status, job_fence)] = _sql(store, "SELECT status, attempt_id FROM jobs")
    [(queue_fence, claimed_by, count, lease)] = _sql(
        store,
        "SELECT attempt_id, claimed_by, attempt_count, extract(epoch FROM visible_at - claimed_at)"
        " FROM job_queue",
    )
    assert (job_status, job_fence, queue_fence, claimed_by, count) == (
        "running",
        claim.attempt_id,
        claim.attempt_id,
        "worker-a",
        1,
    )
    assert float(lease) == 90.0


def test_claim_returns_none_when_nothing_is_visible(store: MaintenanceStore) -> None:
    assert store.claim("w", 30) is None
    store.submit("db", "t0", ["rewrite_data_files"])
    assert store.claim("w", 30) is not None
    assert store.claim("w", 30) is None  # leased, not visible


@pytest.mark.parametrize(
    "worker, lease", [("", 30), ("w", -1), ("w", float("nan")), ("w", float("inf")), ("w", "30")]
)
def test_claim_rejects_bad_arguments(store: MaintenanceStore, worker: str, lease: float) -> None:
    with pytest.raises(ValueError):
        store.claim(worker, lease)


def test_concurrent_claims_from_threads_never_share_a_job(store: MaintenanceStore) -> None:
    store.cache.replace_table_cache([CachedTable("db", f"c{i}") for i in range(120)])
    submitted = {store.submit("db", f"c{i}", ["rewrite_manifests"]) for i in range(120)}
    claimed: dict[str, list[str]] = {f"w{i}": [] for i in range(6)}
    barrier = threading.Barrier(6)

    def work(worker: str) -> None:
        barrier.wait()
        while (claim := store.claim(worker, 60)) is not None:
            claimed[worker].append(claim.job_id)
            assert store.complete(claim, "completed")

    threads = [threading.Thread(target=work, args=(name,)) for name in claimed]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every_claim = [job for jobs in claimed.values() for job in jobs]
    assert len(every_claim) == len(set(every_claim)) == 120
    assert set(every_claim) == submitted
    assert _sql(store, "SELECT status, count(*) FROM jobs GROUP BY status") == [("completed", 120)]


def _claim_all_in_process(
    dsn: str, schema: str, worker: str, start: multiprocessing.synchronize.Event
) -> list[str]:
    start.wait()
    done = []
    with MaintenanceStore(dsn, schema=schema) as store:
        while (claim := store.claim(worker, 60)) is not None:
            done.append(claim.job_id)
            store.complete(claim, "completed")
    return done


def test_concurrent_claims_from_processes_never_share_a_job(store: MaintenanceStore) -> None:
    store.cache.replace_table_cache([CachedTable("db", f"p{i}") for i in range(100)])
    for i in range(100):
        store.submit("db", f"p{i}", ["rewrite_manifests"])
    context = racing_processes()
    with context.Manager() as manager:
        start = manager.Event()
        pool = context.Pool(4)
        try:
            pending = [
                pool.apply_async(_claim_all_in_process, (store.dsn, store.schema, f"proc{i}", start))
                for i in range(4)
            ]
            start.set()
            results = [result.get(timeout=120) for result in pending]
        finally:
            pool.close()  # the workers end on their own: terminate() would rely on SIGTERM reaching them
            pool.join()
    every_claim = [job for jobs in results for job in jobs]
    assert len(every_claim) == len(set(every_claim)) == 100


def test_expired_leases_are_retried_before_new_work(store: MaintenanceStore) -> None:
    first = store.submit("db", "t0", ["rewrite_data_files"])
    claim = store.claim("w", 30)
    assert claim is not None and claim.job_id == first
    store.submit("db", "t1", ["rewrite_data_files"])
    run_out_lease(store, first)
    retry = store.claim("w2", 30)
    assert retry is not None and retry.job_id == first and retry.attempt_count == 2


def test_claim_plan_probes_the_seed_indexes_instead_of_sorting_the_queue(store: MaintenanceStore) -> None:
    from runstate.sqlfiles import queries

    dequeue_with_claim = queries("postgres", "maintenance", "queue.sql")["dequeue_with_claim"]

    _sql(
        store,
        "INSERT INTO jobs (job_id, database_name, table_name, actions, dry_run, status, submitted_at)"
        " SELECT 'j' || g, 'db', 't' || g, '{rewrite_manifests}', false, 'pending', now()"
        " FROM generate_series(1, 5000) g",
    )
    _sql(store, "INSERT INTO job_queue (job_id, visible_at) SELECT job_id, now() FROM jobs")
    _sql(store, "ANALYZE jobs")
    _sql(store, "ANALYZE job_queue")
    params = {"worker": "w", "lease_seconds": 30.0, "attempt_id": "a", "max_attempts": 3}
    with psycopg.connect(store.dsn, options=f"-c search_path={store.schema}") as conn:
        plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + dequeue_with_claim, params))
    assert "idx_job_queue_ready" in plan and "idx_job_queue_claimed" in plan, plan
    assert "Seq Scan on job_queue" not in plan and "Sort" not in plan, plan
