"""The maintenance store's way to Postgres: the process's PostgresDatastore, with driver errors translated.

The datastore (runstate.datastore) owns the pool: autocommit connections whose search_path is the
store's schema, handed back to the pool inline, pinged only after sitting idle. Each queue operation is
a single statement; multi-statement writes use `transaction()`. Driver errors leave this module as
`StoreUnavailable` / `StoreError` (MaintenanceError), with the driver's error chained.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout

from runstate.datastore import PostgresDatastore
from runstate.maintenance.errors import MaintenanceError, StoreError, StoreUnavailable

APPLICATION_NAME = "runstate-maintenance"


class Database:
    """Statements on the datastore's pooled connections; safe to share between threads."""

    def __init__(self, datastore: PostgresDatastore) -> None:
        self.datastore = datastore

    @property
    def schema(self) -> str:
        return self.datastore.schema

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection; a broken one is discarded by the pool when it comes back."""
        with _store_errors(), self.datastore.connection() as conn:
            yield conn

    @contextmanager
    def pinned(self) -> Iterator[None]:
        """This thread's statements share one pooled connection until the block ends (a worker loop)."""
        with _store_errors(), self.datastore.pinned():
            yield

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Cursor]:
        with self.connection() as conn, conn.transaction(), conn.cursor() as cur:
            yield cur

    @contextmanager
    def cursor(self) -> Iterator[psycopg.Cursor]:
        """A cursor for autocommit statements (inside `pinned()`, the pinned connection's, reused)."""
        with _store_errors(), self.datastore.cursor() as cur:
            yield cur

    def fetchone(self, query: Any, params: Sequence[Any] | dict[str, Any] | None = None) -> tuple | None:
        with self.cursor() as cur:
            return cur.execute(query, params).fetchone()

    def fetchall(self, query: Any, params: Sequence[Any] | dict[str, Any] | None = None) -> list[tuple]:
        with self.cursor() as cur:
            return cur.execute(query, params).fetchall()

    def rowcount(self, query: Any, params: Sequence[Any] | dict[str, Any] | None = None) -> int:
        with self.cursor() as cur:
            return cur.execute(query, params).rowcount


@contextmanager
def _store_errors() -> Iterator[None]:
    """Driver errors as the maintenance domain's own."""
    try:
        yield
    except MaintenanceError:
        raise
    except PoolTimeout as exc:
        raise StoreUnavailable(f"maintenance store: no connection in time: {exc}") from exc
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"maintenance store: cannot connect to Postgres: {_first_line(exc)}") from exc
    except psycopg.Error as exc:
        raise StoreError(f"maintenance store: {type(exc).__name__}: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
