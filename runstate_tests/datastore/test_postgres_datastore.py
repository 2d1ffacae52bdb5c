"""PostgresDatastore: session settings made at connect time, no round trip per checkout, fork-safe."""

from __future__ import annotations

import multiprocessing
import os
import select

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from runstate.datastore import PostgresDatastore


@pytest.fixture
def store(pg_database: str, pg_schema: str):
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {pg_schema}")
        conn.execute(f"CREATE TABLE {pg_schema}.items (id INT PRIMARY KEY)")
    datastore = PostgresDatastore(pg_database, schema=pg_schema, application_name="runstate-test")
    yield datastore
    datastore.close()


def test_a_connection_is_autocommit_in_the_schema_and_named(store, pg_schema):
    with store.connection() as conn:
        path = conn.execute("SHOW search_path").fetchone()[0]
        name = conn.execute("SHOW application_name").fetchone()[0]

        assert conn.autocommit
    assert path == f"{pg_schema},public"
    assert name == "runstate-test"


@pytest.fixture
def pings(monkeypatch) -> list[int]:
    """One entry per ping the pool sends (its check_connection, spied on, still pings)."""
    seen: list[int] = []
    real_check = ConnectionPool.check_connection
    monkeypatch.setattr(ConnectionPool, "check_connection", lambda conn: (seen.append(1), real_check(conn)))
    return seen


def test_a_busy_connection_is_handed_out_without_a_ping(store, pings):
    for _ in range(20):
        with store.connection() as conn:
            conn.execute("SELECT 1")

    assert pings == []


def test_an_idle_connection_is_checked_before_it_is_handed_out(store, pings):
    store.check_after_idle_s = 0.0

    for _ in range(3):
        with store.connection() as conn:
            conn.execute("SELECT 1")

    assert len(pings) == 3


def test_a_transaction_rolls_back_when_its_block_raises(store):
    with pytest.raises(RuntimeError), store.transaction() as conn:
        conn.execute("INSERT INTO items VALUES (1)")
        raise RuntimeError("abandon")
    with store.transaction(pipeline=True) as conn:
        conn.execute("INSERT INTO items VALUES (2)")

    with store.connection() as conn:
        assert conn.execute("SELECT id FROM items").fetchall() == [(2,)]


def _child_counts(store: PostgresDatastore, results) -> None:
    with store.connection() as conn:
        results.put((os.getpid(), conn.execute("SELECT pg_backend_pid()").fetchone()[0]))


def test_a_forked_child_opens_its_own_connections_and_leaves_the_parents_alone(store):
    with store.connection() as conn:
        parent_backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_child_counts, args=(store, results))

    child.start()
    child_pid, child_backend = results.get(timeout=120)
    child.join(timeout=120)

    assert child.exitcode == 0 and child_pid != os.getpid()
    assert child_backend != parent_backend
    with store.connection() as conn:  # the parent's session survived the child's exit
        assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] == parent_backend


def test_an_unreachable_server_fails_at_once_with_the_drivers_reason():
    store = PostgresDatastore("postgresql://postgres@127.0.0.1:1/nowhere", connect_timeout=2)

    with pytest.raises(psycopg.OperationalError, match="127.0.0.1"), store.connection():
        pass


def test_a_closed_datastore_refuses_checkouts(store):
    store.close()

    with pytest.raises(psycopg.InterfaceError, match="closed"), store.connection():
        pass


def test_a_pinned_block_keeps_one_connection_and_replaces_it_when_it_dies(pg_database, pg_schema):
    # One connection in all: a pinned connection the block did not give back would starve the checkout after it.
    store = PostgresDatastore(pg_database, schema=pg_schema, pool_size=1, connect_timeout=5)
    try:
        with store.pinned():
            with store.connection() as conn:
                first_pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            with store.connection() as conn:
                assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] == first_pid
            with psycopg.connect(pg_database, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (first_pid,))
            with pytest.raises(psycopg.OperationalError), store.connection() as conn:
                conn.execute("SELECT 1")  # the statement that meets the dead session fails, as unpinned
            with store.connection() as conn:
                replaced_pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        with store.connection() as conn:
            after_pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    finally:
        store.close()

    assert replaced_pid != first_pid and after_pid == replaced_pid


def test_a_pinned_block_reuses_one_cursor_and_outside_it_each_cursor_is_new(store):
    with store.pinned():
        with store.cursor() as first:
            first.execute("SELECT 1")
        with store.cursor() as second:
            assert second.execute("SELECT 2").fetchone() == (2,)
    with store.cursor() as outside:
        outside.execute("SELECT 3")

    assert second is first and outside is not first
    assert outside.closed  # an unpinned cursor is closed with its block


def test_an_error_that_arrives_before_the_commit_is_sent_rolls_back_without_a_psycopg_warning(store, caplog):
    """A statement of the pipelined transaction fails on the server, and its error reaches the client
    before the block ends (as under load, in a race on one run): sending COMMIT then reads the error.
    The transaction rolls back, the server's error is the one raised, and psycopg has nothing left to
    log ("error ignored terminating <psycopg.Pipeline [INERROR]>: pipeline aborted")."""
    with store.connection() as conn:
        conn.execute("INSERT INTO items VALUES (1)")

    with caplog.at_level("WARNING", logger="psycopg"):
        with pytest.raises(psycopg.errors.UniqueViolation), store.transaction(pipeline=True) as conn:
            conn.execute("INSERT INTO items VALUES (2)")
            conn.execute("INSERT INTO items VALUES (1)")  # fails; nothing reads its result in the block
            conn.pgconn.flush()
            # The server sends an error at once (a success waits for the Sync): wait until it is here.
            assert select.select([conn.pgconn.socket], [], [], 30)[0]
        with store.transaction(pipeline=True) as conn:
            conn.execute("INSERT INTO items VALUES (3)")

    assert [r.getMessage() for r in caplog.records if r.name == "psycopg"] == []
    with store.connection() as conn:
        assert conn.execute("SELECT id FROM items ORDER BY id").fetchall() == [(1,), (3,)]
