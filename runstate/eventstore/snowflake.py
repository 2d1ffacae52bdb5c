"""The event store on Snowflake: SnowflakeBackend (its transactions and statements) and SnowflakeEventStore,
tested on fakesnow's server.

Snowflake enforces neither PRIMARY KEY nor UNIQUE and fakesnow cannot run the design's stored
procedure (shipped untested as sql/snowflake/eventstore/procedures/append_event.sql), so the append
authority is the store's locked append (appender.py), application-side, inside one explicit transaction per
batch, with this backend's statements:

1. Before the transaction (`open_stream`): make sure the run's RUN_STREAMS row exists, in a statement of
   its own (a racing creator fails there and is retried, never at the append's COMMIT), and take a feed
   position.
2. `lock_stream`: a no-op UPDATE of the stream row. On Snowflake that DML statement takes the table's
   write lock until COMMIT, so appenders serialise; on fakesnow's DuckDB two transactions writing the same
   row conflict and the loser is rolled back. Then read LAST_SEQ.
3. `existing_keys` (always: nothing refuses a second key, `enforces_keys` is False); the store numbers the
   new events from LAST_SEQ.
4. `insert_new`: `MERGE INTO RUN_EVENTS ... ON (RUN_ID, IDEMPOTENCY_KEY) WHEN NOT MATCHED THEN INSERT`
   from a `SELECT ... PARSE_JSON(..) FROM VALUES ...` source, one statement per 1000 rows, then advance
   the stream row. A state snapshot when due; COMMIT.

Any failure rolls back and the whole transaction is retried with jittered backoff. Every statement
writes absolute values (never `x = x + n`), so a statement the connector re-sends after a timeout
cannot double-count; and since a re-sent COMMIT can look like success when the first failed
(`confirms_commits`), the store reads the written keys back and repeats the append until they are there.

The feed, and its documented limit: each append takes one value of RUN_EVENTS_POSITION_SEQ just
before its transaction and gives its events positions (value << 20) + their place in the batch.
(fakesnow cannot take a sequence value inside a transaction that has written.) Positions are unique
and increase along each run, but Snowflake has no transaction ids or snapshots to build a
high-water mark from: two appenders that overlap can commit in the other order than their
positions, and a reader that passed the later position skips the earlier one. The feed is exact
when appenders do not overlap (what the tests check); Postgres is the backend for a gap-free feed.
"""

from __future__ import annotations

import base64
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

from runstate import defaults, migrations, sqlfiles
from runstate.datastore import SnowflakeDatastore, check_schema_name
from runstate.datastore.snowflake import rollback_quietly
from runstate.eventstore.backend import Rows, StoreBackend, Stream
from runstate.eventstore.contract import (
    TERMINAL_EVENT_TYPES,
    ConcurrencyConflict,
    EventStoreError,
    EventType,
    InvalidEvent,
    RunSnapshot,
    StoredEvent,
    one_line,
)
from runstate.eventstore.sf_sql import (
    Retry,
    b64,
    chunks,
    from_json,
    iso,
    retryable,
    row_to_event,
    values_params,
    values_rows,
)
from runstate.eventstore.snapshots import EncodedSnapshot, StoredSnapshot
from runstate.eventstore.store import EventStore
from runstate.eventstore.validation import ValidEvent

log = logging.getLogger("runstate.eventstore.snowflake")
T = TypeVar("T")

_MAX_ATTEMPTS = 80
_BATCH_ROWS = 1000
# snapshots' optional bounds, (upto given, kind given), to the named query that has them.
_SNAPSHOTS_QUERY = {
    (False, False): "snapshots",
    (True, False): "snapshots_upto",
    (False, True): "snapshots_of_kind",
    (True, True): "snapshots_upto_of_kind",
}

_append = sqlfiles.named("snowflake", "eventstore", "append.sql")
_snapshots = sqlfiles.named("snowflake", "eventstore", "snapshots.sql")
_reads = sqlfiles.named("snowflake", "eventstore", "reads.sql")
_archive = sqlfiles.named("snowflake", "eventstore", "archive.sql")
_store = sqlfiles.named("snowflake", "eventstore", "store.sql")


class SnowflakeBackend(StoreBackend):
    """The event store's statements and transactions on Snowflake, through snowflake-connector-python."""

    name = "snowflake"
    enforces_keys = False
    confirms_commits = True
    guesses = False
    archive_batch_runs = 200

    def __init__(
        self,
        datastore: SnowflakeDatastore,
        *,
        merge_in_transactions: bool | None = None,
        owns_datastore: bool = False,
    ):
        super().__init__(datastore, owns_datastore=owns_datastore)
        self.merge_in_transactions = merge_in_transactions
        self._probe_lock = threading.Lock()

    # -- transactions -------------------------------------------------------------------------

    @contextmanager
    def _cursor(self) -> Iterator[Any]:
        if self.closed:
            raise EventStoreError("the event store is closed")
        with self.datastore.cursor() as cur:
            yield cur

    def run(
        self, what: str, work: Callable[[Any], T], *, transactional: bool = True, pipeline: bool = False
    ) -> T:
        """`work` (in BEGIN..COMMIT when transactional); on a race or a transient error roll back and retry."""
        from snowflake.connector import errors as sf_errors

        last: Exception | None = None
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            try:
                with self._cursor() as cur:
                    if not transactional:
                        return work(cur)
                    cur.execute("BEGIN")
                    try:
                        result = work(cur)
                        cur.execute("COMMIT")
                        return result
                    except BaseException:
                        rollback_quietly(cur)
                        raise
            except (sf_errors.Error, Retry) as exc:
                if not retryable(exc):
                    raise EventStoreError(f"{what}: {one_line(exc)}") from exc
                last = exc
                time.sleep(min(0.25, 0.003 * 2 ** min(attempt, 8)) * random.random())
            except InvalidEvent:
                raise
            except (ValueError, OverflowError) as exc:  # a stored value the connector cannot convert
                raise EventStoreError(f"{what}: unreadable value ({one_line(exc)})") from exc
        raise ConcurrencyConflict(f"{what}: gave up after {_MAX_ATTEMPTS} attempts ({last})") from last

    def ensure_schema(self) -> None:
        from snowflake.connector import errors as sf_errors

        try:
            migrations.upgrade(self.datastore, "eventstore")
        except (sf_errors.Error, migrations.MigrationError) as exc:
            raise EventStoreError(f"schema {self.schema!r}: migrations failed: {one_line(exc)}") from exc

    def _merge_usable(self) -> bool:
        """Can MERGE run inside an explicit transaction? Real Snowflake: yes. fakesnow: no (its MERGE
        emulation creates a temporary table, which DuckDB refuses mid-transaction). Probed once, before
        the first write transaction (it takes a connection of its own)."""
        if self.merge_in_transactions is None:
            with self._probe_lock:
                if self.merge_in_transactions is None:
                    self.merge_in_transactions = self._probe_merge()
                    if not self.merge_in_transactions:
                        log.info(
                            "schema %s: MERGE is unavailable inside transactions (fakesnow); "
                            "using the equivalent INSERT ... WHERE NOT EXISTS",
                            self.schema,
                        )
        return self.merge_in_transactions

    def _probe_merge(self) -> bool:
        from snowflake.connector import errors as sf_errors

        with self._cursor() as cur:
            cur.execute("BEGIN")
            try:
                cur.execute(_store("probe_merge"))
                return True
            except sf_errors.Error:
                return False
            finally:
                rollback_quietly(cur)

    # -- a run's stream -------------------------------------------------------------------------

    def open_stream(self, run_id: str) -> int:
        """Make the stream row, then take the append's feed position: its events take the 2**20
        positions above the returned value."""
        self._merge_usable()

        def create(cur: Any) -> None:
            if not self._stream_exists(cur, run_id):
                cur.execute(_append("create_stream"), (run_id,))

        self.run(f"create stream for run {run_id!r}", create, transactional=False)

        def position(cur: Any) -> int:
            cur.execute(_append("next_position"))
            return int(cur.fetchone()[0]) << 20

        return self.run("take a feed position", position, transactional=False)

    def _stream_exists(self, cur: Any, run_id: str) -> bool:
        cur.execute(_append("stream_exists"), (run_id,))
        return bool(cur.fetchone()[0])

    def lock_stream(self, cur: Any, run_id: str) -> Stream:
        """The no-op UPDATE is the write that serialises the run's appenders (the row exists: open_stream):
        Snowflake holds the table's DML lock to COMMIT; DuckDB (fakesnow) fails the second concurrent
        writer of the row at once, before anything else happens."""
        cur.execute(_append("touch_stream"), (run_id,))
        if cur.rowcount != 1:
            raise Retry(f"run {run_id!r}: stream row missing")
        cur.execute(_append("read_stream"), (run_id,))
        rows = cur.fetchall()
        if len(rows) != 1:
            raise Retry(f"run {run_id!r}: {len(rows)} stream rows")
        return Stream(int(rows[0][0]), int(rows[0][1]), bool(rows[0][2]))

    def find_stream(self, cur: Any, run_id: str) -> Stream | None:
        return self.lock_stream(cur, run_id) if self._stream_exists(cur, run_id) else None

    def existing_keys(self, cur: Any, run_id: str, keys: Sequence[str], *, archived: bool) -> dict[str, int]:
        found: dict[str, int] = {}
        for name in ("existing_keys", "existing_archived_keys") if archived else ("existing_keys",):
            for chunk in chunks(keys, _BATCH_ROWS):
                cur.execute(_append(name), (run_id, tuple(chunk)))
                found.update({row[0]: int(row[1]) for row in cur.fetchall()})
        return found

    def insert_new(self, cur: Any, run_id: str, stream: Stream, new: Rows, ticket: int) -> None:
        self._insert(cur, run_id, new, None, ticket)
        self._advance_stream(cur, run_id, new[-1][0], stream.event_count + len(new), [e for _, e in new])

    def _insert(
        self, cur: Any, run_id: str, rows: Rows, stamps: Mapping[int, datetime] | None, position_base: int
    ) -> None:
        total = 0
        for start in range(0, len(rows), _BATCH_ROWS):
            chunk = rows[start : start + _BATCH_ROWS]
            # The same effect either way; insert_new_events where MERGE cannot run in a transaction.
            # Only the count of placeholder groups is composed here (see values_rows); values are bound.
            statement = _append("merge_events" if self._merge_usable() else "insert_new_events")
            params = values_params(run_id, chunk, stamps, position_base + start)
            cur.execute(statement.replace("{rows}", values_rows(len(chunk))), params)
            total += cur.rowcount or 0
        if total != len(rows):  # a concurrent writer slipped in
            raise Retry(f"run {run_id!r}: merged {total} of {len(rows)} rows")

    def _advance_stream(
        self, cur: Any, run_id: str, last_seq: int, count: int, events: Sequence[ValidEvent]
    ) -> None:
        started = next((e.emitted_at for e in events if e.event_type == EventType.RUN_STARTED), None)
        completed = next((e.emitted_at for e in events if e.event_type in TERMINAL_EVENT_TYPES), None)
        cur.execute(
            _append("advance_stream"),
            (last_seq, count, events[0].emitted_at.isoformat(), iso(started), iso(completed), run_id),
        )

    # -- snapshots and projections ------------------------------------------------------------------

    def write_snapshot(
        self, cur: Any, run_id: str, seq: int, kind: str, encoded: EncodedSnapshot, reason: str, keep: int
    ) -> bool:
        payload = base64.b64encode(encoded.payload).decode("ascii")
        cur.execute(
            _snapshots("insert_snapshot"),
            (run_id, seq, kind, encoded.encoding, payload, encoded.checksum, encoded.raw_bytes,
             encoded.stored_bytes, reason, run_id, seq),
        )  # fmt: skip
        inserted = cur.rowcount
        cur.execute(_snapshots("snapshot_seqs"), (run_id,))
        seqs = [int(r[0]) for r in cur.fetchall()]
        if len(seqs) > keep:
            cur.execute(_snapshots("prune_snapshots"), (run_id, seqs[keep - 1]))
        return bool(inserted)

    def snapshots(
        self, cur: Any, run_id: str, *, upto: int | None = None, kind: str | None = None
    ) -> list[StoredSnapshot]:
        params = [run_id, *([upto] if upto is not None else []), *([kind] if kind is not None else [])]
        cur.execute(_snapshots(_SNAPSHOTS_QUERY[upto is not None, kind is not None]), params)
        return [StoredSnapshot(r[0], int(r[1]), r[2], r[3], b64(r[4]), r[5]) for r in cur.fetchall()]

    def stored_projection(self, cur: Any, run_id: str) -> RunSnapshot | None:
        cur.execute(_reads("stored_projection"), (run_id,))
        row = cur.fetchone()
        return RunSnapshot.from_dict(from_json(row[0]), version=int(row[1])) if row else None

    def save_projection(self, cur: Any, run_id: str, snap: RunSnapshot, stored: RunSnapshot | None) -> bool:
        values = (snap.status, snap.last_event_seq, json.dumps(snap.to_dict()), iso(snap.started_at),
                  iso(snap.completed_at))  # fmt: skip
        if stored is None:
            # Outside a transaction, so MERGE runs on fakesnow too; the PK makes a racing insert fail there.
            cur.execute(_reads("insert_projection"), (run_id, *values))
        else:
            cur.execute(_reads("update_projection"), (*values, stored.version + 1, run_id, stored.version))
        return cur.rowcount == 1

    # -- reads --------------------------------------------------------------------------------------

    def fetch(
        self, cur: Any, run_id: str, after_seq: int, limit: int, upto: int | None = None
    ) -> list[StoredEvent]:
        # An archived run is read from RUN_EVENTS_ARCHIVE too: the bounds go once for each table.
        if upto is None:
            name, bounds = "fetch_run", [run_id, after_seq]
        else:
            name, bounds = "fetch_run_upto", [run_id, after_seq, upto]
        cur.execute(_reads(name), [*bounds, *bounds, limit])
        return [row_to_event(row) for row in cur.fetchall()]

    def feed(self, cur: Any, after_position: int, limit: int) -> list[StoredEvent]:
        """Position order, which is commit order only while appenders do not overlap (module docs)."""
        cur.execute(_reads("feed"), (after_position, after_position, limit))
        return [row_to_event(row) for row in cur.fetchall()]

    def run_ids(self, cur: Any, after: str, limit: int) -> list[str]:
        cur.execute(_reads("run_ids"), (after, limit))
        return [r[0] for r in cur.fetchall()]

    def max_seq(self, cur: Any, run_id: str) -> int:
        cur.execute(_reads("max_seq"), (run_id, run_id))
        return int(cur.fetchone()[0] or 0)

    def stale_runs(self, cur: Any, limit: int) -> list[tuple[str, datetime | None, int]]:
        cur.execute(_reads("stale_runs_with_start"), (limit,))
        return [(r[0], r[1] if r[2] else None, int(r[3])) for r in cur.fetchall()]

    def runs_started_between(self, cur: Any, start: datetime, end: datetime) -> list[str]:
        cur.execute(_reads("runs_started_between"), (start.isoformat(), end.isoformat()))
        return [r[0] for r in cur.fetchall()]

    # -- archive and import -------------------------------------------------------------------------

    def archive_runs(self, cur: Any, cutoff: datetime, limit: int) -> tuple[int, int]:
        cur.execute(_archive("archivable_runs"), (cutoff.isoformat(), cutoff.isoformat(), limit))
        runs = tuple(r[0] for r in cur.fetchall())
        if not runs:
            return 0, 0
        # Touch the stream rows first: appenders to these runs now conflict with us, not interleave.
        cur.execute(_archive("mark_archived"), (runs,))
        cur.execute(_archive("copy_to_archive"), (runs,))
        cur.execute(_archive("delete_archived_events"), (runs,))
        moved = cur.rowcount or 0
        cur.execute(_archive("delete_snapshots_of_runs"), (runs,))
        return len(runs), moved

    def unarchive(self, cur: Any, run_id: str) -> int:
        cur.execute(_archive("copy_from_archive"), (run_id,))
        moved = cur.rowcount or 0
        if moved:
            cur.execute(_archive("delete_restored_events"), (run_id,))
            cur.execute(_archive("mark_restored"), (run_id,))
        return moved

    def taken_seqs(self, cur: Any, run_id: str, seqs: Sequence[int]) -> set[int]:
        taken: set[int] = set()
        for chunk in chunks(seqs, _BATCH_ROWS):
            cur.execute(_archive("taken_seqs"), (run_id, tuple(chunk)))
            taken.update(int(r[0]) for r in cur.fetchall())
        return taken

    def insert_imported(
        self, cur: Any, run_id: str, stream: Stream, rows: Rows, stamps: Mapping[int, datetime], ticket: int
    ) -> None:
        """Keeps each event's persisted_at."""
        self._insert(cur, run_id, rows, stamps, ticket)
        top = max(stream.last_seq, max(seq for seq, _ in rows))
        self._advance_stream(cur, run_id, top, stream.event_count + len(rows), [e for _, e in rows])


class SnowflakeEventStore(EventStore):
    """The event store on Snowflake through snowflake-connector-python; thread-safe.

    `store_options` are EventStore's (snapshot_interval, keep_snapshots, max_event_bytes,
    large_snapshot_bytes, archive_to, lake)."""

    def __init__(
        self,
        connection_factory: Callable[[], Any] | None = None,
        *,
        schema: str = defaults.SNOWFLAKE_SCHEMA,
        connect_kwargs: Mapping[str, Any] | None = None,
        pool_size: int = defaults.POOL_SIZE,
        merge_in_transactions: bool | None = None,
        datastore: SnowflakeDatastore | None = None,
        **store_options: Any,
    ):
        schema = check_schema_name(schema).upper()
        if datastore is not None and (
            connect_kwargs is not None or connection_factory is not None or datastore.schema != schema
        ):
            raise ValueError("give a datastore of this schema, or connect_kwargs / connection_factory")
        owned = datastore is None
        # The one owner of the connections (runstate.datastore): a bounded LIFO pool, since Snowflake
        # connections are few and slow to open; USE SCHEMA once per connection.
        datastore = datastore or SnowflakeDatastore(
            connect_kwargs, connection_factory=connection_factory, schema=schema, pool_size=pool_size
        )
        super().__init__(
            SnowflakeBackend(datastore, merge_in_transactions=merge_in_transactions, owns_datastore=owned),
            **store_options,
        )


def open_store(datastore: SnowflakeDatastore, **options: Any) -> SnowflakeEventStore:
    """The store on `datastore`, which it closes when it closes (runstate.backends' `event_store`)."""
    return SnowflakeEventStore(datastore=datastore, schema=datastore.schema, **options).owning_datastore()
