"""A `store` fixture parametrized over the backends, plus raw SQL access for fault injection.

Each test gets its own Postgres schema or Snowflake (fakesnow) schema via the shared fixtures, or its own
tables of the in-memory backend (memory_backend.py, registered for the test only), which has no SQL: a
test that reaches for it is skipped there.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from runstate import backends
from runstate.eventstore import PostgresEventStore, SnowflakeEventStore
from runstate.eventstore.config import EventStoreConfig
from runstate_tests.eventstore.memory_backend import MEMORY
from runstate_tests.support.databases import unique
from runstate_tests.support.events import Backend


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
