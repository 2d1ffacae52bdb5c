"""SnowflakeDatastore: the one owner of a process's snowflake-connector connections.

Snowflake connections are few and slow to open (a login each), so a small LIFO pool keeps the
warmest ones: at most `pool_size` are out at once, a connection is made on demand and selects the
schema once (`USE SCHEMA`: the event store's named queries and the migrations name tables unqualified,
and fakesnow's MERGE needs it), and one whose session is gone (OperationalError, InterfaceError) is closed instead of
returned. After a fork the child starts with an empty pool and never touches the parent's
sessions (closing one would log the parent out).

The connector is imported when the first connection is made, never at import: the code location
must load without it. Errors are the connector's, translated by each domain into its own root.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from runstate import defaults
from runstate.datastore.names import check_schema_name


class SnowflakeDatastore:
    """A bounded pool of connector connections; safe to share between threads."""

    backend = "snowflake"

    def __init__(
        self,
        connect_kwargs: Mapping[str, Any] | None = None,
        *,
        connection_factory: Callable[[], Any] | None = None,
        schema: str = defaults.SNOWFLAKE_SCHEMA,
        pool_size: int = defaults.POOL_SIZE,
    ) -> None:
        if (connection_factory is None) == (connect_kwargs is None):
            raise ValueError("give exactly one of connect_kwargs or connection_factory")
        self.schema = check_schema_name(schema).upper()
        self.connect_kwargs = dict(connect_kwargs or {})
        self._factory = connection_factory or self._connect_with_kwargs
        self.pool_size = max(1, int(pool_size))
        self._idle: queue.LifoQueue[Any] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(self.pool_size)
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        where = self.connect_kwargs.get("host") or self.connect_kwargs.get("account") or "snowflake"
        return f"SnowflakeDatastore({where!r}, schema={self.schema!r})"

    @property
    def where(self) -> str:
        """host:port (or the account) for messages; never the credentials."""
        kwargs = self.connect_kwargs
        return f"{kwargs.get('host') or kwargs.get('account') or '?'}:{kwargs.get('port', 443)}"

    def _connect_with_kwargs(self) -> Any:
        import snowflake.connector

        return snowflake.connector.connect(**self.connect_kwargs)

    def connect(self) -> Any:
        """A new connection outside the pool, with no schema selected (the caller closes it):
        the migrations use it, because the schema may not exist yet."""
        return self._factory()

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """A pooled connection whose current schema is this datastore's."""
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        from snowflake.connector import errors as sf_errors

        self._forget_if_forked()
        self._slots.acquire()
        conn = None
        healthy = True
        try:
            conn = self._checkout()
            yield conn
        except (sf_errors.OperationalError, sf_errors.InterfaceError):
            healthy = False  # the session itself is gone; a statement error leaves it usable
            raise
        finally:
            if conn is not None:
                self._checkin(conn, healthy)
            self._slots.release()

    @contextmanager
    def cursor(self) -> Iterator[Any]:
        with self.connection() as conn:
            yield conn.cursor()

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A cursor inside BEGIN..COMMIT; ROLLBACK (best effort) when the block raises."""
        with self.cursor() as cur:
            cur.execute("BEGIN")
            try:
                yield cur
            except BaseException:
                rollback_quietly(cur)
                raise
            cur.execute("COMMIT")

    def close(self) -> None:
        """Close the idle connections; a later checkout raises."""
        self._closed = True
        if self._pid != os.getpid():
            return
        while True:
            try:
                close_quietly(self._idle.get_nowait())
            except queue.Empty:
                return

    def _checkout(self) -> Any:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            pass
        conn = self._factory()
        try:
            conn.cursor().execute(f"USE SCHEMA {self.schema}")
        except BaseException:
            close_quietly(conn)
            raise
        return conn

    def _checkin(self, conn: Any, healthy: bool) -> None:
        if healthy and not self._closed and not getattr(conn, "is_closed", lambda: False)():
            self._idle.put(conn)
        else:
            close_quietly(conn)

    def _forget_if_forked(self) -> None:
        if self._pid == os.getpid():
            return
        with self._lock:
            if self._pid != os.getpid():
                self._idle = queue.LifoQueue()
                self._slots = threading.BoundedSemaphore(self.pool_size)
                self._pid = os.getpid()


def close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # closing a dead session: nothing left to release
        pass


def rollback_quietly(cur: Any) -> None:
    try:
        cur.execute("ROLLBACK")
    except Exception:  # the session may be gone; the server ends its transaction then
        pass
