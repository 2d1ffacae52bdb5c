"""PostgresDatastore: the one owner of a process's connections to runstate's Postgres schema.

Built once (by `runstate.wiring`, or by a test) and handed to whatever needs the database: the event
store, the maintenance queue, the migrations. It holds a `psycopg_pool.ConnectionPool` of autocommit
connections whose session is configured when the connection is made (the startup packet's
`options` sets `search_path`; `application_name` names the caller), so a checkout costs no round trip:
no SET, and no ping unless the connection sat idle (see CHECK_AFTER_IDLE_SECONDS).

Errors are the driver's: psycopg errors pass through unchanged (psycopg_pool's PoolTimeout is a
psycopg.OperationalError too), and each domain translates them into its own error root.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

from runstate import defaults
from runstate.datastore.names import check_schema_name
from runstate.datastore.urls import redact

# A connection used (or made) within this many seconds is handed out without a ping: a ping is a round
# trip per checkout, which halved the maintenance queue's throughput, while a session that died that
# recently is rare (its statement then fails with an OperationalError, and the pool replaces it).
CHECK_AFTER_IDLE_SECONDS = 1.0
# Seconds to connect (libpq's connect_timeout, unless the DSN sets its own) and to wait for a pooled one.
CONNECT_TIMEOUT_S = 10.0


class PostgresDatastore:
    """A lazily opened pool; safe to share between threads, and a forked child opens its own."""

    backend = "postgres"

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = defaults.SCHEMA,
        pool_size: int = defaults.POOL_SIZE,
        min_size: int = 0,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        application_name: str = "runstate",
        check_after_idle_s: float | None = CHECK_AFTER_IDLE_SECONDS,
    ) -> None:
        self.dsn = dsn
        self.schema = check_schema_name(schema)
        self.pool_size = max(1, int(pool_size))
        self.min_size = min(max(0, int(min_size)), self.pool_size)
        self.connect_timeout = float(connect_timeout)
        self.application_name = application_name
        self.check_after_idle_s = check_after_idle_s
        self._pool: ConnectionPool | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False
        self._pinned = threading.local()

    def __repr__(self) -> str:
        return f"PostgresDatastore({redact(self.dsn)!r}, schema={self.schema!r})"

    @property
    def conninfo(self) -> str:
        """The DSN with this datastore's session settings, for a connection of one's own (LISTEN, say)."""
        existing = conninfo_to_dict(self.dsn).get("options")
        options = f"-c search_path={self.schema},public"
        params: dict[str, Any] = {"options": f"{existing} {options}" if existing else options}
        if "application_name" not in conninfo_to_dict(self.dsn):
            params["application_name"] = self.application_name
        if "connect_timeout" not in conninfo_to_dict(self.dsn):
            params["connect_timeout"] = max(1, round(self.connect_timeout))
        return make_conninfo(self.dsn, **params)

    def connect(self, **kwargs: Any) -> psycopg.Connection:
        """A new connection outside the pool (the caller closes it): for LISTEN and the migrations."""
        return psycopg.connect(self.conninfo, **{"autocommit": True, **kwargs})

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A pooled autocommit connection; one that comes back broken is discarded by the pool.

        Inside `pinned()`, the thread's pinned connection: no checkout at all."""
        pinned = getattr(self._pinned, "conn", None)
        if pinned is not None:
            conn = self._usable(pinned)
            try:
                yield conn
            finally:
                _stamp_used(conn)
            return
        with self._get_pool().connection() as conn:
            try:
                yield conn
            finally:
                _stamp_used(conn)

    @contextmanager
    def cursor(self) -> Iterator[psycopg.Cursor]:
        """A cursor on a pooled connection; inside `pinned()`, the pinned connection's own cursor, made
        once: a new cursor per statement costs about a fifth of a short statement's client time."""
        with self.connection() as conn:
            if conn is getattr(self._pinned, "conn", None):
                if self._pinned.cursor is None:
                    self._pinned.cursor = conn.cursor()
                yield self._pinned.cursor
            else:
                with conn.cursor() as cursor:
                    yield cursor

    @contextmanager
    def pinned(self) -> Iterator[None]:
        """Keep one pooled connection for this thread's statements until the block ends.

        For a loop of short statements (a worker's claims and completions): a pool checkout and return
        per statement cost more client CPU than the statement itself. The connection is checked as a
        checkout would check it (after sitting idle) and replaced when it broke; nested blocks share it.
        """
        if getattr(self._pinned, "conn", None) is not None:
            yield
            return
        pool = self._get_pool()
        self._pinned.conn, self._pinned.cursor = pool.getconn(), None
        try:
            yield
        finally:
            conn, self._pinned.conn, self._pinned.cursor = self._pinned.conn, None, None
            pool.putconn(conn)

    def _usable(self, conn: psycopg.Connection) -> psycopg.Connection:
        """The pinned connection, or a fresh one in its place when it broke or fails its idle check."""
        try:
            if conn.broken or conn.closed:
                raise psycopg.OperationalError("the pinned connection is closed")
            self._check_if_idle(conn)
            return conn
        except psycopg.Error:
            pool = self._get_pool()
            pool.putconn(conn)  # the pool discards a closed or broken connection
            self._pinned.conn, self._pinned.cursor = pool.getconn(), None
            return self._pinned.conn

    @contextmanager
    def transaction(self, *, pipeline: bool = False) -> Iterator[psycopg.Connection]:
        """A pooled connection inside BEGIN..COMMIT (ROLLBACK when the block raises).

        With `pipeline`, see pipelined_transaction: one flight, up to the first result the block reads."""
        with self.connection() as conn:
            if pipeline:
                with pipelined_transaction(conn):
                    yield conn
            else:
                with conn.transaction():
                    yield conn

    def close(self) -> None:
        """Close the pool; a later checkout raises. A pool inherited through fork is left alone."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            pool.close()

    def _get_pool(self) -> ConnectionPool:
        pool = self._pool
        if pool is not None and self._pid == os.getpid():
            return pool
        with self._lock:
            if self._closed:
                raise psycopg.InterfaceError(f"{self!r} is closed")
            if self._pool is None or self._pid != os.getpid():
                # A pool inherited through fork holds the parent's sockets and no worker threads:
                # leave it alone (closing it would end the parent's sessions) and start afresh.
                self._probe()
                self._pool = self._new_pool()
                self._pid = os.getpid()
            return self._pool

    def _probe(self) -> None:
        """One direct connection first: an unreachable server fails now, with the driver's reason,
        instead of a bare PoolTimeout after `connect_timeout`."""
        self.connect().close()

    def _new_pool(self) -> ConnectionPool:
        return ConnectionPool(
            self.conninfo,
            min_size=self.min_size,
            max_size=self.pool_size,
            timeout=self.connect_timeout,
            kwargs={"autocommit": True},
            name=f"runstate-{self.schema}",
            open=True,
            configure=_stamp_used,
            check=self._check_if_idle,
            # No `reset=`: with one, psycopg_pool hands every returned connection to a worker thread
            # (two thread handoffs per checkout, and the pool grows to max_size because a caller's
            # next checkout finds its connection not back yet). connection() stamps inline instead.
        )

    def _check_if_idle(self, conn: psycopg.Connection) -> None:
        if self.check_after_idle_s is None:
            return
        used = getattr(conn, "_runstate_used_at", None)
        if used is None or time.monotonic() - used >= self.check_after_idle_s:
            ConnectionPool.check_connection(conn)


def _stamp_used(conn: psycopg.Connection) -> None:
    conn._runstate_used_at = time.monotonic()  # type: ignore[attr-defined]


@contextmanager
def pipelined_transaction(conn: psycopg.Connection) -> Iterator[None]:
    """The block's statements between a BEGIN and a COMMIT, in pipeline mode: they leave as the block
    sends them, and the client waits when the block reads a result and once at its end. Any error, the
    server's or the block's, rolls them back, and the block's own exception is the one raised.
    (psycopg's transaction() inside a pipeline syncs at its edges: three more round trips.) Inside a
    transaction already (a pinned connection's), psycopg's nested transaction, a savepoint."""
    if conn.info.transaction_status != TransactionStatus.IDLE:
        with conn.pipeline(), conn.transaction():
            yield
        return
    try:
        with conn.pipeline():
            conn.execute("BEGIN")
            try:
                yield
                # Sending COMMIT also reads the results already here: an error of the block's statements
                # that arrived before it (the server sends errors at once) is raised here.
                conn.execute("COMMIT")
            except BaseException:
                # The block's exception (or that early error), not the aborted ones after it, is raised;
                # the rollback collects those, so the pipeline ends with nothing left to log.
                _roll_back(conn)
                raise
    except BaseException:
        if conn.info.transaction_status != TransactionStatus.IDLE:
            conn.rollback()  # a server error left the transaction open and failed
        raise


def _roll_back(conn: psycopg.Connection) -> None:
    """Roll back a pipelined transaction with `conn.rollback()`, never a ROLLBACK statement.

    psycopg forgets the connection's prepared statements on a rollback. rollback() deallocates them on
    the server at once; after a ROLLBACK statement psycopg does it only at the end of the next execute,
    after that execute prepared its own statement again, so the next use of that one failed with
    `prepared statement "_pg3_N" does not exist`. The first call syncs the pipeline, which collects the
    aborted statements' errors (the pipeline's exit would log them as warnings) and may raise the first
    of them before it rolls back: then the second rolls back."""
    for _ in range(2):
        try:
            conn.rollback()
            return
        except psycopg.Error:
            continue
