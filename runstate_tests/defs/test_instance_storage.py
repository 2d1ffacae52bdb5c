"""The project's instance storage (runstate.defs.instance.storage): Dagster's Postgres storage on a few
connections kept open, which it replaces when Postgres closed them, and closes when disposed."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import psycopg
import pytest
from sqlalchemy.pool import QueuePool

from runstate.defs.instance.storage import POOL_SIZE

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def database(fresh_database: str, monkeypatch) -> str:
    """A database of the test's own, which the checkout's dagster.yaml names."""
    monkeypatch.setenv("DAGSTER_PG_URL", fresh_database.replace("postgresql://", "postgresql+psycopg2://", 1))
    return fresh_database


@pytest.fixture
def instance(database: str) -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.from_config(str(REPO_ROOT)) as instance:
        yield instance


def backends(database: str) -> set[int]:
    """The server processes connected to `database` (this query's own connection excluded)."""
    with psycopg.connect(database, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return {pid for (pid,) in rows}


@dg.op
def count_to_three() -> int:
    return 3


@dg.job
def counting_job() -> None:
    count_to_three()


def storage_round(instance: dg.DagsterInstance) -> None:
    """A daemon's kinds of statements: runs, their events, instigator state and the key-value store."""
    result = counting_job.execute_in_process(instance=instance)
    assert result.success
    assert instance.get_run_by_id(result.run_id) is not None
    assert len(instance.all_logs(result.run_id)) > 5
    instance.run_storage.set_cursor_values({"runstate.test": result.run_id})
    assert instance.run_storage.get_cursor_values({"runstate.test"}) == {"runstate.test": result.run_id}
    instance.all_instigator_state()


def test_the_projects_instance_keeps_one_pool_for_its_three_storages(instance):
    engine = instance.run_storage._engine  # noqa: SLF001 - what the storage was given

    assert isinstance(engine.pool, QueuePool)
    assert instance.event_log_storage._engine is engine  # noqa: SLF001
    assert instance.schedule_storage._engine is engine  # noqa: SLF001


def test_runs_events_and_state_go_through_the_pools_few_connections(instance, database):
    storage_round(instance)
    held = backends(database)
    for _ in range(3):
        storage_round(instance)

    assert 0 < len(held) <= POOL_SIZE + 1  # the pool's, and the event watcher's LISTEN connection
    assert backends(database) == held  # the same server processes: no connection per statement


def test_connections_postgres_closed_are_replaced_before_the_next_statement(instance, database):
    storage_round(instance)
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )

    storage_round(instance)  # a statement on a dead connection would raise here


def test_a_disposed_instance_leaves_no_connection_open(database):
    with dg.DagsterInstance.from_config(str(REPO_ROOT)) as instance:
        storage_round(instance)
        assert backends(database)

    assert backends(database) == set()


def test_an_instance_on_existing_tables_opens_one_connection_to_start(instance, database, monkeypatch):
    """dagster-postgres's storages look for their tables on two new connections each, six in all, every
    time an instance is made: a code server makes one per sensor tick."""
    import psycopg2

    connect = psycopg2.connect
    opened: list[object] = []
    monkeypatch.setattr(psycopg2, "connect", lambda *a, **k: opened.append(a) or connect(*a, **k))
    with dg.DagsterInstance.from_ref(instance.get_ref()) as another:
        started = len(opened)
        storage_round(another)

    assert started == 1
    assert len(opened) <= POOL_SIZE + 1  # the event watcher's LISTEN connection besides the pool's


def test_in_the_webserver_each_storage_takes_its_own_pool_and_the_shared_one_closes(instance, database):
    storage_round(instance)
    instance.optimize_for_webserver(statement_timeout=0, pool_recycle=3600, max_overflow=20)

    assert backends(database) == set()
    storage_round(instance)
    assert instance.run_storage._engine is not instance.event_log_storage._engine  # noqa: SLF001


def test_loading_the_storage_class_imports_no_definitions():
    """The webserver, the daemon and `runstate services up` import this package for the instance's storage
    class (dagster.yaml names it); the code location's definitions and PySpark stay out of them."""
    heavy = ("runstate.definitions", "runstate.defs.runs", "runstate.defs.eventstore", "pyspark")
    code = f"import sys, runstate.defs.instance.storage; print([m for m in sys.modules if m.startswith({heavy!r})])"

    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )

    assert done.stdout.strip() == "[]"
