"""PostgresEventStore: the run state store on PostgreSQL.

- run_seq comes from the run's row in `run_streams`, locked by an upsert in the append
  transaction: writers to one run serialise on that row only, writers to other runs never wait.
- `append_batch` is one round trip in the common case: ONE statement upserts the stream row and
  inserts every event (`unnest` of arrays); when the event count crosses a multiple of
  `snapshot_interval` (or the batch has SignalWaiting), a second statement in the same flight and
  transaction writes the state snapshot, which the client encodes while the server inserts, and a
  large batch sends its first third ahead while the client validates the rest. The database refuses
  the inserts when the store's guess of the run was wrong, and the append is then made in a locked
  transaction (pg_append.py).
- `expected_last_seq` (optimistic concurrency) is checked under the stream row lock.
- Every event gets a feed position (see sql/postgres/eventstore/002_event_feed.sql and pg_reads.py).
- Hash partitioning: `partitions=N` creates run_events PARTITION BY HASH (run_id) on first
  ensure_schema (see sql/postgres/eventstore/001_eventstore.sql).
- Retries: serialization failures, deadlocks and unique-key races re-run the whole transaction
  with jittered backoff; a dropped connection is retried twice. A retry after a COMMIT whose
  outcome was lost reports those events as `idempotent=True, persisted=False`: the log itself
  holds each key once either way (at-least-once reporting, exactly-once storage). Every other
  driver error leaves as an EventStoreError naming what failed.
- Connections come from a PostgresDatastore (runstate.datastore), the one owner of a process's
  Postgres pool: given (shared with the maintenance queue, say) or built from the DSN.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
from psycopg import errors

from runstate import migrations, sqlfiles
from runstate.datastore import PostgresDatastore, check_schema_name
from runstate.eventstore.base import EventStore
from runstate.eventstore.contract import (
    DEFAULT_MAX_EVENT_BYTES,
    ConcurrencyConflict,
    EventStoreError,
)
from runstate.eventstore.hints import RunHints
from runstate.eventstore.pg_append import KeyTaken, _PgAppend
from runstate.eventstore.pg_archive import _PgArchive
from runstate.eventstore.pg_reads import _PgReads
from runstate.eventstore.pg_snapshots import _PgSnapshots
from runstate.eventstore.pg_sql import KEY_TAKEN_SQLSTATE

T = TypeVar("T")

_RETRYABLE = (errors.SerializationFailure, errors.DeadlockDetected, errors.UniqueViolation)
_MAX_ATTEMPTS = 20


_sql = sqlfiles.named("postgres", "eventstore", "store.sql")


class PostgresEventStore(_PgAppend, _PgSnapshots, _PgReads, _PgArchive, EventStore):
    """The event store on Postgres; thread-safe (the datastore's pool of `pool_size` connections)."""

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str = "runstate",
        snapshot_interval: int = 100,
        keep_snapshots: int = 3,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        partitions: int = 0,
        pool_size: int = 8,
        large_snapshot_bytes: int = 100 * 1024,
        connect_timeout: float = 10.0,
        datastore: PostgresDatastore | None = None,
    ):
        if (datastore is None) == (dsn is None):
            raise ValueError("give a dsn or a datastore, not both")
        if datastore is not None and datastore.schema != check_schema_name(schema):
            raise ValueError(f"the datastore is for schema {datastore.schema!r}, not {schema!r}")
        self.schema = check_schema_name(schema)
        if int(partitions) < 0 or int(partitions) > 1024:
            raise ValueError(f"partitions must be between 0 and 1024, got {partitions!r}")
        if int(max_event_bytes) < 1:
            raise ValueError(f"max_event_bytes must be positive, got {max_event_bytes!r}")
        self.partitions = int(partitions)
        self._init_policy(
            max_event_bytes=max_event_bytes,
            snapshot_interval=snapshot_interval,
            keep_snapshots=keep_snapshots,
            large_snapshot_bytes=large_snapshot_bytes,
        )
        self._owns_store = datastore is None
        self._store = datastore or PostgresDatastore(
            dsn, schema=self.schema, pool_size=pool_size, connect_timeout=connect_timeout
        )
        self._closed = False
        self.hints = RunHints()

    @property
    def datastore(self) -> PostgresDatastore:
        return self._store

    def _run(
        self,
        what: str,
        work: Callable[[psycopg.Connection], T],
        *,
        transactional: bool = True,
        pipeline: bool = False,
    ) -> T:
        """Run `work` (in a transaction when transactional), retrying serialisation/deadlock/unique
        races with backoff and a lost connection twice; any other driver error is an EventStoreError.
        In pipeline mode statements go out without waiting, up to the first result `work` reads,
        and the COMMIT leaves with the statements before it."""
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            try:
                if self._closed:
                    raise EventStoreError("the event store is closed")
                if not transactional:
                    with self._store.connection() as conn:
                        return work(conn)
                with self._store.transaction(pipeline=pipeline) as conn:
                    return work(conn)
            except _RETRYABLE as exc:
                if attempt == _MAX_ATTEMPTS:
                    raise ConcurrencyConflict(f"{what}: gave up after {attempt} attempts ({exc})") from exc
                time.sleep(min(0.2, 0.002 * 2**attempt) * random.random())
            except psycopg.OperationalError as exc:
                if attempt >= 3:
                    raise EventStoreError(f"{what}: database unavailable ({_one_line(exc)})") from exc
                time.sleep(0.05 * attempt)
            except psycopg.Error as exc:
                if exc.sqlstate == KEY_TAKEN_SQLSTATE:
                    raise KeyTaken() from exc
                raise EventStoreError(f"{what}: {type(exc).__name__}: {_one_line(exc)}") from exc
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the store; the datastore too when the store built it (a given one is its owner's)."""
        self._closed = True
        if self._owns_store:
            self._store.close()

    # -- schema -------------------------------------------------------------------------------

    def ensure_schema(self) -> None:
        """Apply the versioned migrations into `schema`; idempotent and safe to race."""
        try:
            migrations.upgrade(
                self._store,
                "eventstore",
                session_settings={"runstate.event_partitions": str(self.partitions)},
            )
        except (psycopg.Error, migrations.MigrationError) as exc:
            raise EventStoreError(f"schema {self.schema!r}: migrations failed: {_one_line(exc)}") from exc
        if self.partitions:
            self._check_partitions()

    def _check_partitions(self) -> None:
        table = f"{self.schema}.run_events"
        found = self._run(
            "count partitions",
            lambda conn: conn.execute(_sql("count_partitions"), (table,)).fetchone()[0],
            transactional=False,
        )
        if found != self.partitions:
            raise EventStoreError(
                f"schema {self.schema!r}: run_events already exists with {found} hash partitions, "
                f"not {self.partitions}; partitioning is chosen when the table is first created"
            )


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
