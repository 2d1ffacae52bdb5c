"""The one connection provider of the maintenance store: a psycopg_pool.ConnectionPool per process.

Connections are in autocommit mode with `search_path` set to the store's schema: each queue
operation is a single statement, and multi-statement writes use `transaction()`. Driver errors leave
this module as `StoreUnavailable` / `StoreError` (MaintenanceError), with the driver's error chained.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from runstate.maintenance.errors import MaintenanceError, StoreError, StoreUnavailable

APPLICATION_NAME = "runstate-maintenance"


class Database:
    """Lazily opened pool; safe to share between threads, and a forked child opens its own."""

    def __init__(self, dsn: str, schema: str, *, max_size: int = 10, timeout: float = 30.0) -> None:
        self.dsn, self.schema = dsn, schema
        self.max_size, self.timeout = max_size, timeout
        self._pool: ConnectionPool | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def _get_pool(self) -> ConnectionPool:
        if self._pool is not None and self._pid == os.getpid():
            return self._pool
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                # A pool inherited through fork holds the parent's sockets and no worker threads:
                # leave it alone (closing it would end the parent's sessions) and start afresh.
                self._probe()
                self._pool = ConnectionPool(
                    self.dsn,
                    min_size=1,
                    max_size=self.max_size,
                    timeout=self.timeout,
                    open=True,
                    kwargs=self._connect_kwargs(),
                    name=f"maintenance-{self.schema}",
                    # A session the server ended (restart, idle timeout, pg_terminate_backend) is
                    # replaced when handed out, instead of failing the caller's statement.
                    check=_check_if_idle,
                    # No `reset=`: with one, psycopg_pool hands every returned connection to a worker
                    # thread (two thread handoffs per job, and the pool grows to max_size because a
                    # caller's next checkout finds its connection not yet back). connection() stamps.
                )
                self._pid = os.getpid()
        return self._pool

    def _connect_kwargs(self) -> dict[str, Any]:
        return {
            "autocommit": True,
            "options": f"-c search_path={self.schema}",
            "application_name": APPLICATION_NAME,
        }

    def _probe(self) -> None:
        """One direct connection first: an unreachable server fails now, not after the pool's timeout."""
        try:
            psycopg.connect(self.dsn, connect_timeout=10, **self._connect_kwargs()).close()
        except psycopg.Error as exc:
            raise StoreUnavailable(
                f"maintenance store: cannot connect to Postgres: {_first_line(exc)}"
            ) from exc

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection; a broken one is discarded by the pool when it comes back."""
        try:
            with self._get_pool().connection() as conn:
                try:
                    yield conn
                finally:
                    _stamp_used(conn)
        except MaintenanceError:
            raise
        except PoolTimeout as exc:
            raise StoreUnavailable(
                f"maintenance store: no connection within {self.timeout:g} s: {exc}"
            ) from exc
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"maintenance store: connection failed: {_first_line(exc)}") from exc
        except psycopg.Error as exc:
            raise StoreError(f"maintenance store: {type(exc).__name__}: {_first_line(exc)}") from exc

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Cursor]:
        with self.connection() as conn, conn.transaction(), conn.cursor() as cur:
            yield cur

    def fetchone(self, query: Any, params: Sequence[Any] | dict[str, Any] | None = None) -> tuple | None:
        with self.connection() as conn:
            return conn.execute(query, params).fetchone()

    def fetchall(self, query: Any, params: Sequence[Any] | dict[str, Any] | None = None) -> list[tuple]:
        with self.connection() as conn:
            return conn.execute(query, params).fetchall()

    def rowcount(self, query: Any, params: Sequence[Any] | dict[str, Any] | None = None) -> int:
        with self.connection() as conn:
            return conn.execute(query, params).rowcount

    def close(self) -> None:
        with self._lock:
            if self._pool is not None and self._pid == os.getpid():
                self._pool.close()
            self._pool = None


# A connection used within this many seconds is handed out without a ping: the ping is a round trip
# per statement, which halved the queue's throughput, while a session that died that recently is rare
# (and its statement fails with StoreUnavailable; the next call gets a checked connection).
CHECK_AFTER_IDLE_SECONDS = 1.0


def _stamp_used(conn: psycopg.Connection) -> None:
    conn._runstate_used_at = time.monotonic()  # type: ignore[attr-defined]


def _check_if_idle(conn: psycopg.Connection) -> None:
    used = getattr(conn, "_runstate_used_at", None)
    if used is None or time.monotonic() - used >= CHECK_AFTER_IDLE_SECONDS:
        ConnectionPool.check_connection(conn)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
