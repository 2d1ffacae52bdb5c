"""The event store on PostgreSQL: PostgresBackend (its transactions and statements) and PostgresEventStore.

- run_seq comes from the run's row in `run_streams`, locked by an upsert in the append transaction:
  writers to one run serialise on that row only, writers to other runs never wait.
- A unique index refuses a second (run_id, idempotency_key), so an append looks keys up only when it
  has to (an archived run, a stale `expected_last_seq`, a key found taken).
- It appends in one round trip in the common case (`guesses`, see appender.py): insert_guessed is ONE
  statement (sql/postgres/eventstore/005_one_statement_append.sql) that upserts the stream row, inserts
  every event (`unnest` of binary arrays, pg_arrays.py) and checks the store's guesses; `flight` sends
  it, the head sent ahead and the snapshot in one pipelined transaction.
- Every event gets a feed position (002_event_feed.sql, pg_feed.py); LISTEN wakes subscribers.
- Hash partitioning: `partitions=N` creates run_events PARTITION BY HASH (run_id) on first ensure_schema
  (001_eventstore.sql).
- Retries: serialization failures, deadlocks and unique-key races re-run the whole transaction with
  jittered backoff; a dropped connection is retried twice. A retry after a COMMIT whose outcome was lost
  reports those events as `idempotent=True, persisted=False`: the log itself holds each key once either
  way (at-least-once reporting, exactly-once storage). Every other driver error leaves as an
  EventStoreError naming what failed.
- Connections come from a PostgresDatastore (runstate.datastore), the one owner of a process's Postgres
  pool: given (shared with the maintenance queue, say) or built from the DSN.
The statements are named queries in sql/postgres/eventstore/ (append, snapshots, reads, feed, archive);
the archive's and the import's are in pg_archive.py.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg import errors

from runstate import defaults, migrations, sqlfiles
from runstate.datastore import PostgresDatastore, check_schema_name, pipelined_transaction
from runstate.datastore.postgres import CONNECT_TIMEOUT_S
from runstate.eventstore.backend import (
    Guess,
    GuessRefused,
    IndexRebuild,
    KeyTaken,
    LakeRecord,
    Rows,
    StoreBackend,
    Stream,
)
from runstate.eventstore.contract import (
    ConcurrencyConflict,
    EventStoreError,
    RunSnapshot,
    StoredEvent,
    one_line,
)
from runstate.eventstore.feed import GAP_FREE_FEED, check_position
from runstate.eventstore.pg_archive import PostgresArchiveStatements
from runstate.eventstore.pg_arrays import bytea_array
from runstate.eventstore.pg_feed import feed_page_params, feed_query, listening
from runstate.eventstore.pg_indexes import compact_run_keyed_indexes
from runstate.eventstore.pg_sql import (
    GUESSED_WRONG_SQLSTATE,
    KEY_TAKEN_SQLSTATE,
    append_events_params,
    batch_params,
    head_params,
    key_bytes,
    key_text,
    snapshot_row_params,
    stored_event,
)
from runstate.eventstore.snapshots import EncodedSnapshot, StoredSnapshot
from runstate.eventstore.store import EventStore
from runstate.eventstore.validation import ValidEvent

T = TypeVar("T")

_RETRYABLE = (errors.SerializationFailure, errors.DeadlockDetected, errors.UniqueViolation)
_MAX_ATTEMPTS = 20
_NO_UPPER_BOUND = 2**62

_append = sqlfiles.named("postgres", "eventstore", "append.sql")
_snapshots = sqlfiles.named("postgres", "eventstore", "snapshots.sql")
_reads = sqlfiles.named("postgres", "eventstore", "reads.sql")
_store = sqlfiles.named("postgres", "eventstore", "store.sql")


class PostgresBackend(PostgresArchiveStatements, StoreBackend):
    """The event store's statements and transactions on Postgres; thread-safe (the datastore's pool)."""

    name = "postgres"
    enforces_keys = True
    confirms_commits = False
    guesses = True
    lake_archives = True

    def __init__(self, datastore: PostgresDatastore, *, partitions: int = 0, owns_datastore: bool = False):
        if int(partitions) < 0 or int(partitions) > 1024:
            raise ValueError(f"partitions must be between 0 and 1024, got {partitions!r}")
        super().__init__(datastore, owns_datastore=owns_datastore)
        self.partitions = int(partitions)

    # -- transactions -------------------------------------------------------------------------

    def run(
        self,
        what: str,
        work: Callable[[psycopg.Connection], T],
        *,
        transactional: bool = True,
        pipeline: bool = False,
    ) -> T:
        """In pipeline mode statements go out without waiting, up to the first result `work` reads, and
        the COMMIT leaves with the statements before it."""
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            try:
                if self.closed:
                    raise EventStoreError("the event store is closed")
                if not transactional:
                    with self.datastore.connection() as conn:
                        return work(conn)
                with self.datastore.transaction(pipeline=pipeline) as conn:
                    return work(conn)
            except _RETRYABLE as exc:
                if attempt == _MAX_ATTEMPTS:
                    raise ConcurrencyConflict(f"{what}: gave up after {attempt} attempts ({exc})") from exc
                time.sleep(min(0.2, 0.002 * 2**attempt) * random.random())
            except psycopg.OperationalError as exc:
                if attempt >= 3:
                    raise EventStoreError(f"{what}: database unavailable ({one_line(exc)})") from exc
                time.sleep(0.05 * attempt)
            except psycopg.Error as exc:
                if exc.sqlstate == KEY_TAKEN_SQLSTATE:
                    raise KeyTaken() from exc
                raise EventStoreError(f"{what}: {type(exc).__name__}: {one_line(exc)}") from exc
        raise AssertionError("unreachable")

    def ensure_schema(self) -> None:
        """Apply the versioned migrations into the schema; the partition count is fixed at the first."""
        try:
            migrations.upgrade(
                self.datastore,
                "eventstore",
                session_settings={"runstate.event_partitions": str(self.partitions)},
            )
        except (psycopg.Error, migrations.MigrationError) as exc:
            raise EventStoreError(f"schema {self.schema!r}: migrations failed: {one_line(exc)}") from exc
        if not self.partitions:
            return
        table = f"{self.schema}.run_events"
        found = self.run(
            "count partitions",
            lambda conn: conn.execute(_store("count_partitions"), (table,)).fetchone()[0],
            transactional=False,
        )
        if found != self.partitions:
            raise EventStoreError(
                f"schema {self.schema!r}: run_events already exists with {found} hash partitions, "
                f"not {self.partitions}; partitioning is chosen when the table is first created"
            )

    # -- a run's stream -------------------------------------------------------------------------

    def lock_stream(self, conn: psycopg.Connection, run_id: str) -> Stream:
        return Stream(*conn.execute(_append("lock_stream"), (run_id,)).fetchone())

    def find_stream(self, conn: psycopg.Connection, run_id: str) -> Stream | None:
        row = conn.execute(_append("find_stream"), (run_id,)).fetchone()
        return Stream(*row) if row else None

    def existing_keys(
        self, conn: psycopg.Connection, run_id: str, keys: Sequence[str], *, archived: bool
    ) -> dict[str, int]:
        query = _append("existing_keys_with_archive" if archived else "existing_keys")
        params = {"keys": bytea_array([key_bytes(key) for key in keys]), "run_id": run_id}
        return {key_text(key): seq for key, seq in conn.execute(query, params).fetchall()}

    def insert_new(
        self, conn: psycopg.Connection, run_id: str, stream: Stream, new: Rows, ticket: Any
    ) -> None:
        # A stored key makes the insert raise RSK01 (KeyTaken), which rolls everything back.
        conn.execute(_append("insert_new"), batch_params(run_id, new, new[-1][0]))

    # -- the one-flight append ----------------------------------------------------------------------

    @contextmanager
    def flight(self, conn: psycopg.Connection, *, together: bool) -> Iterator[None]:
        """Two statements go in a pipelined transaction (pipelined_transaction: BEGIN..COMMIT in one
        flight); a lone statement is its own transaction, and faster without pipeline mode. A key already
        stored (a unique violation) or a wrong guess (RSK02) rolled everything back: GuessRefused."""
        try:
            with pipelined_transaction(conn) if together else nullcontext():
                yield
        except psycopg.Error as exc:
            if isinstance(exc, errors.UniqueViolation) or exc.sqlstate == GUESSED_WRONG_SQLSTATE:
                raise GuessRefused() from exc
            raise

    def insert_head(self, conn: psycopg.Connection, run_id: str, head: Sequence[ValidEvent]) -> None:
        conn.execute(_append("insert_head"), head_params(run_id, head), prepare=True)

    def insert_guessed(
        self, conn: psycopg.Connection, run_id: str, new: Sequence[ValidEvent], sent_ahead: int, guess: Guess
    ) -> Callable[[], tuple[int, int]]:
        params = append_events_params(run_id, new, sent_ahead)
        params.update(
            expected=guess.expected_last_seq,
            every=guess.snapshot_every,
            signal_waiting=guess.signal_waiting,
            snapshot_seq=guess.snapshot_seq,
            snapshot_count_before=guess.snapshot_count_before,
        )
        cursor = conn.execute(_append("append_events"), params, prepare=True)
        return cursor.fetchone

    # -- snapshots and projections ------------------------------------------------------------------

    def write_snapshot(
        self,
        conn: psycopg.Connection,
        run_id: str,
        seq: int,
        kind: str,
        encoded: EncodedSnapshot,
        reason: str,
        keep: int,
    ) -> bool:
        """One statement: the insert and the prune of all but the latest `keep`. The append's pipeline
        sends it without waiting for its result, so it cannot tell whether one was already at `seq`."""
        params = {
            "run_id": run_id,
            "seq": seq,
            **snapshot_row_params(kind, encoded, reason),
            "older": keep - 1,
        }
        conn.execute(_snapshots("write_snapshot"), params)
        return True

    def snapshots(
        self, conn: psycopg.Connection, run_id: str, *, upto: int | None = None, kind: str | None = None
    ) -> list[StoredSnapshot]:
        params = {"run_id": run_id, "upto": _NO_UPPER_BOUND if upto is None else upto, "kind": kind}
        rows = conn.execute(_snapshots("snapshots"), params).fetchall()
        return [StoredSnapshot(r[0], r[1], r[2], r[3], bytes(r[4]), r[5]) for r in rows]

    def stored_projection(self, conn: psycopg.Connection, run_id: str) -> RunSnapshot | None:
        row = conn.execute(_reads("stored_projection"), (run_id,)).fetchone()
        return RunSnapshot.from_dict(row[0], version=row[1]) if row else None

    def save_projection(
        self, conn: psycopg.Connection, run_id: str, snap: RunSnapshot, stored: RunSnapshot | None
    ) -> bool:
        params: dict[str, Any] = {
            "run_id": run_id,
            "status": snap.status,
            "seq": snap.last_event_seq,
            "data": json.dumps(snap.to_dict()),
            "started": snap.started_at,
            "completed": snap.completed_at,
        }
        if stored is None:
            return conn.execute(_reads("insert_projection"), params).rowcount == 1
        return conn.execute(_reads("update_projection"), {**params, "version": stored.version}).rowcount == 1

    # -- reads --------------------------------------------------------------------------------------

    def fetch(
        self, conn: psycopg.Connection, run_id: str, after_seq: int, limit: int, upto: int | None = None
    ) -> list[StoredEvent]:
        params = {
            "run_id": run_id,
            "after": after_seq,
            "limit": limit,
            "upto": _NO_UPPER_BOUND if upto is None else upto,
        }
        return [
            stored_event(row) for row in conn.execute(_reads("fetch_run"), params, binary=True).fetchall()
        ]

    def fetch_with_lake(
        self, conn: psycopg.Connection, run_id: str, after_seq: int, limit: int, upto: int | None = None
    ) -> tuple[list[StoredEvent], LakeRecord | None]:
        """One statement (reads.sql's fetch_run_with_lake): each row leads with the run's lake record."""
        params = {
            "run_id": run_id,
            "after": after_seq,
            "limit": limit,
            "upto": _NO_UPPER_BOUND if upto is None else upto,
        }
        rows = conn.execute(_reads("fetch_run_with_lake"), params, binary=True).fetchall()
        record = LakeRecord(int(rows[0][0]), int(rows[0][1])) if rows and rows[0][0] is not None else None
        return [stored_event(row[2:]) for row in rows if row[2] is not None], record

    def feed(self, conn: psycopg.Connection, after_position: int, limit: int) -> list[StoredEvent]:
        """Only what no later commit can precede (pg_feed.py says how)."""
        params = feed_page_params(conn, after_position, limit)
        return [stored_event(row) for row in conn.execute(feed_query("feed"), params, binary=True).fetchall()]

    def feed_bound(self, conn: psycopg.Connection, after_position: int, limit: int) -> tuple[int, int]:
        """(how many events the feed's next page of `limit` holds, its last position): no row is read."""
        count, last = conn.execute(
            feed_query("feed_bound"), feed_page_params(conn, after_position, limit)
        ).fetchone()
        return int(count), int(last)

    def feed_waiter(self) -> AbstractContextManager[Callable[[float], None]]:
        return listening(self.datastore.conninfo, self.schema)

    def run_ids(self, conn: psycopg.Connection, after: str, limit: int) -> list[str]:
        return [r[0] for r in conn.execute(_reads("run_ids"), (after, limit)).fetchall()]

    def runs_created_at(self, conn: psycopg.Connection, run_ids: Sequence[str]) -> dict[str, datetime]:
        return dict(conn.execute(_reads("runs_created_at"), (list(run_ids),)).fetchall())

    def max_seq(self, conn: psycopg.Connection, run_id: str) -> int:
        return conn.execute(_reads("max_seq"), {"run_id": run_id}).fetchone()[0] or 0

    def stale_runs(self, conn: psycopg.Connection, limit: int) -> list[tuple[str, datetime | None, int]]:
        return [(r[0], r[1], r[2]) for r in conn.execute(_reads("stale_runs"), (limit,)).fetchall()]

    def runs_started_between(self, conn: psycopg.Connection, start: datetime, end: datetime) -> list[str]:
        return [r[0] for r in conn.execute(_reads("runs_started_between"), (start, end)).fetchall()]

    # -- the lake and the indexes -------------------------------------------------------------------

    def lake_owner(self, conn: psycopg.Connection) -> str:
        return f"{conn.execute(_store('current_database')).fetchone()[0]}.{self.schema}"

    def compact_indexes(self) -> list[IndexRebuild]:
        try:
            return compact_run_keyed_indexes(self.datastore)
        except psycopg.Error as exc:
            raise EventStoreError(f"compact the run-keyed indexes: {one_line(exc)}") from exc


class PostgresEventStore(EventStore):
    """The event store on Postgres; thread-safe (the datastore's pool of `pool_size` connections).

    `store_options` are EventStore's (snapshot_interval, keep_snapshots, max_event_bytes,
    large_snapshot_bytes, archive_to, lake)."""

    # Its feed pages by a commit-ordered high-water mark (pg_feed.py): the run history exports it.
    capabilities = frozenset({GAP_FREE_FEED})

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str = defaults.SCHEMA,
        partitions: int = 0,
        pool_size: int = defaults.POOL_SIZE,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        datastore: PostgresDatastore | None = None,
        **store_options: Any,
    ):
        if (datastore is None) == (dsn is None):
            raise ValueError("give a dsn or a datastore, not both")
        if datastore is not None and datastore.schema != check_schema_name(schema):
            raise ValueError(f"the datastore is for schema {datastore.schema!r}, not {schema!r}")
        owned = datastore is None
        datastore = datastore or PostgresDatastore(
            dsn, schema=check_schema_name(schema), pool_size=pool_size, connect_timeout=connect_timeout
        )
        super().__init__(
            PostgresBackend(datastore, partitions=partitions, owns_datastore=owned),
            **store_options,
        )
        self.partitions = self.backend.partitions

    def feed_bound(self, after_position: int = 0, limit: int = 1000) -> tuple[int, int]:
        """How many events `fetch_all(after_position, limit)` would return, and the position of its last
        (`after_position` when none), without reading them: the run history's export bounds a batch so,
        then reads its rows through Spark's JDBC source (every one of them has committed)."""
        check_position(after_position, limit)
        return self._read("bound the feed", lambda tx: self.backend.feed_bound(tx, after_position, limit))

    def lake_owner(self) -> str:
        """The store's name, `<database>.<schema>`, as the run history's tables record their owner: a table
        belongs to one store (lake/tables.py)."""
        return self._read("read the store's name", self.backend.lake_owner)

    def runs_created_at(self, run_ids: Sequence[str]) -> dict[str, datetime]:
        """When the store first saw each of `run_ids` (its stream's creation time, which never changes);
        a run the store does not know is left out."""
        return self._read("read when runs were created", lambda tx: self.backend.runs_created_at(tx, run_ids))

    def export_query(self) -> str:
        """The query whose rows Spark's JDBC source reads for the run history (feed.sql's export_rows):
        every event, with its columns as the lake keeps them, to be bounded by `position`."""
        return feed_query("export_rows")


def open_store(datastore: PostgresDatastore, **options: Any) -> PostgresEventStore:
    """The store on `datastore`, which it closes when it closes (runstate.backends' `event_store`)."""
    return PostgresEventStore(datastore=datastore, schema=datastore.schema, **options).owning_datastore()
