"""A `store` fixture parametrized over the backends, plus raw SQL access for fault injection.

Each test gets its own Postgres schema or Snowflake (fakesnow) schema via the shared fixtures, or its own
tables of the in-memory backend (memory_backend.py, registered for the test only), which has no SQL: a
test that reaches for it is skipped there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from runstate import backends
from runstate.eventstore import NewEvent, PostgresEventStore, SnowflakeEventStore
from runstate.eventstore.config import EventStoreConfig
from runstate_tests.eventstore.memory_backend import MEMORY
from runstate_tests.support.databases import unique

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def ev(run_id: str, event_type: str, n: int = 0, **kw: Any) -> NewEvent:
    """A NewEvent at T0 + n seconds; `key` kw sets an explicit idempotency key."""
    if "key" in kw:
        kw["idempotency_key"] = kw.pop("key")
    return NewEvent(run_id=run_id, event_type=event_type, emitted_at=T0 + timedelta(seconds=n), **kw)


def events_table(backend: Backend) -> str:
    return "run_events" if backend.name == "postgres" else "RUN_EVENTS"


def count_rows(backend: Backend, table: str, run_id: str) -> int:
    return backend.sql(f"SELECT COUNT(*) FROM {table} WHERE run_id = %s", (run_id,))[0][0]


@dataclass
class Backend:
    name: str
    make: Callable[..., Any]
    sql: Callable[[str, tuple], list[tuple]]
    # Divides the thread tests' work: fakesnow is one DuckDB behind HTTP, orders of magnitude slower.
    # Snowflake's 100 leaves 5 appends a thread, the fewest that still re-send an earlier key.
    scale: int


def _postgres_backend(dsn: str, schema: str) -> Backend:
    stores: list[Any] = []

    def make(**kw: Any) -> PostgresEventStore:
        store = PostgresEventStore(dsn, schema=schema, **kw)
        store.ensure_schema()
        stores.append(store)
        return store

    def sql(query: str, params: tuple = ()) -> list[tuple]:
        with psycopg.connect(dsn, autocommit=True, options=f"-c search_path={schema}") as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    backend = Backend("postgres", make, sql, scale=1)
    backend._stores = stores  # type: ignore[attr-defined]
    return backend


def _snowflake_backend(kwargs: dict, schema: str) -> Backend:
    import snowflake.connector

    stores: list[Any] = []

    def make(**kw: Any) -> SnowflakeEventStore:
        store = SnowflakeEventStore(connect_kwargs=kwargs, schema=schema, **kw)
        store.ensure_schema()
        stores.append(store)
        return store

    def sql(query: str, params: tuple = ()) -> list[tuple]:
        conn = snowflake.connector.connect(**kwargs, schema=schema)
        try:
            cur = conn.cursor()
            cur.execute(query, params)
            return cur.fetchall() if cur.description else []
        finally:
            conn.close()

    backend = Backend("snowflake", make, sql, scale=100)
    backend._stores = stores  # type: ignore[attr-defined]
    return backend


def _memory_backend() -> Backend:
    """Built the way wiring builds any backend: its registry entry's datastore and store."""
    entry = backends.get(MEMORY.name)
    datastore = entry.build_datastore(EventStoreConfig(pg_schema=unique("m")))
    stores: list[Any] = []

    def make(**kw: Any) -> Any:
        store = entry.open_event_store(datastore, **kw)
        store.ensure_schema()
        stores.append(store)
        return store

    def sql(query: str, params: tuple = ()) -> list[tuple]:
        pytest.skip("the in-memory backend has no SQL")

    backend = Backend(MEMORY.name, make, sql, scale=1)
    backend._stores = stores  # type: ignore[attr-defined]
    return backend


@pytest.fixture(params=["postgres", "snowflake", MEMORY.name])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "postgres":
        made = _postgres_backend(request.getfixturevalue("pg_database"), request.getfixturevalue("pg_schema"))
    elif request.param == "snowflake":
        kwargs, schema = request.getfixturevalue("snowflake_schema")
        made = _snowflake_backend(kwargs, schema)
    else:
        with backends.registered(MEMORY):
            made = _memory_backend()
            yield made
        return
    yield made
    for store in made._stores:  # type: ignore[attr-defined]
        store.close()


@pytest.fixture
def store(backend: Backend):
    return backend.make()


@pytest.fixture
def pg_store(pg_database: str, pg_schema: str) -> Iterator[PostgresEventStore]:
    store = PostgresEventStore(pg_database, schema=pg_schema)
    store.ensure_schema()
    yield store
    store.close()


@pytest.fixture
def sf_store(snowflake_schema) -> Iterator[SnowflakeEventStore]:
    kwargs, schema = snowflake_schema
    store = SnowflakeEventStore(connect_kwargs=kwargs, schema=schema)
    store.ensure_schema()
    yield store
    store.close()
