"""SnowflakeEventStore: the run state store on Snowflake (seed 000), tested on fakesnow's server.

Snowflake enforces neither PRIMARY KEY nor UNIQUE and fakesnow cannot run the seed's stored
procedure (shipped untested as sql/snowflake/procedures/append_event.sql), so the append authority
lives here, application-side, inside one explicit transaction per batch:

1. `MERGE` the run's RUN_STREAMS row (insert it, or touch it). On Snowflake that DML statement
   takes the table's write lock until COMMIT, so appenders serialise; on fakesnow's DuckDB two
   transactions writing the same row conflict and the loser is rolled back.
2. Read LAST_SEQ and look up the batch's idempotency keys; assign new run_seqs from LAST_SEQ.
3. `MERGE INTO RUN_EVENTS ... ON (RUN_ID, IDEMPOTENCY_KEY) WHEN NOT MATCHED THEN INSERT` from a
   `SELECT ... PARSE_JSON(..) FROM VALUES ...` source: one statement for the whole batch.
4. Advance the stream row; write a state snapshot when due; COMMIT.

Any failure rolls back and the whole transaction is retried with jittered backoff. Every statement
writes absolute values (never `x = x + n`), so a statement the connector re-sends after a timeout
cannot double-count. `expected_last_seq` is checked after step 1, under the stream row's lock.

The feed, and its documented limit: each append takes one value of RUN_EVENTS_POSITION_SEQ just
before its transaction and gives its events positions (value << 20) + their place in the batch.
(fakesnow cannot take a sequence value inside a transaction that has written.) Positions are unique
and increase along each run, but Snowflake has no transaction ids or snapshots to build a
high-water mark from: two appenders that overlap can commit in the other order than their
positions, and a reader that passed the later position skips the earlier one. The feed is exact
when appenders do not overlap (what the tests check); Postgres is the backend for a gap-free feed.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Callable, Iterator, Mapping, Sequence, TypeVar

from runstate.eventstore.base import _EventStoreBase
from runstate.eventstore.contract import (
    DEFAULT_MAX_EVENT_BYTES,
    TERMINAL_EVENT_TYPES,
    AppendResult,
    ConcurrencyConflict,
    EventStoreError,
    EventType,
    InvalidEvent,
    NewEvent,
    RunSnapshot,
)
from runstate.eventstore.sf_archive import _SfArchive
from runstate.eventstore.sf_reads import _SfReads
from runstate.eventstore.sf_snapshots import _SfSnapshots
from runstate.eventstore.sf_sql import (
    COLUMNS,
    S_COLUMNS,
    SOURCE_SELECT,
    VALUES_ROW,
    chunks,
    Retry,
    close_quietly,
    iso,
    retryable,
    rollback_quietly,
)
from runstate.eventstore.validation import ValidEvent
from runstate.migrations import MigrationError, check_schema_name, upgrade_snowflake

log = logging.getLogger("runstate.eventstore.snowflake")
T = TypeVar("T")

_MAX_ATTEMPTS = 80
_BATCH_ROWS = 1000


class SnowflakeEventStore(_SfSnapshots, _SfReads, _SfArchive, _EventStoreBase):
    """The event store on Snowflake through snowflake-connector-python; thread-safe."""

    def __init__(
        self,
        connection_factory: Callable[[], Any] | None = None,
        *,
        schema: str = "RUNSTATE",
        snapshot_interval: int = 100,
        keep_snapshots: int = 3,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        connect_kwargs: Mapping[str, Any] | None = None,
        pool_size: int = 8,
        large_snapshot_bytes: int = 100 * 1024,
        merge_in_transactions: bool | None = None,
    ):
        if (connection_factory is None) == (connect_kwargs is None):
            raise ValueError("give exactly one of connection_factory or connect_kwargs")
        self.schema = check_schema_name(schema).upper()
        if connection_factory is None:
            kwargs = dict(connect_kwargs or {})

            def connection_factory() -> Any:
                import snowflake.connector

                return snowflake.connector.connect(**kwargs)

        self._factory = connection_factory
        self._init_policy(
            max_event_bytes=max_event_bytes, snapshot_interval=snapshot_interval,
            keep_snapshots=keep_snapshots, large_snapshot_bytes=large_snapshot_bytes,
        )
        # Snowflake connections are few and slow to open: a LIFO queue keeps the warmest ones.
        self._pool: queue.LifoQueue[Any] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(max(1, int(pool_size)))
        self._closed = False
        self._merge_in_tx = merge_in_transactions
        self._probe_lock = threading.Lock()
        self._init_recent()

    def _t(self, table: str) -> str:
        return f"{self.schema}.{table}"

    # -- connections --------------------------------------------------------------------------

    @contextmanager
    def _cursor(self) -> Iterator[Any]:
        if self._closed:
            raise EventStoreError("the event store is closed")
        self._slots.acquire()
        from snowflake.connector import errors as sf_errors

        conn = None
        healthy = True
        try:
            try:
                conn = self._pool.get_nowait()
            except queue.Empty:
                conn = self._factory()
                # fakesnow's MERGE needs a current schema (real Snowflake is fine with qualified names).
                conn.cursor().execute(f"USE SCHEMA {self.schema}")
            yield conn.cursor()
        except (sf_errors.OperationalError, sf_errors.InterfaceError):
            healthy = False  # the session itself is gone; a statement error leaves it usable
            raise
        finally:
            if conn is not None:
                if healthy and not getattr(conn, "is_closed", lambda: False)():
                    self._pool.put(conn)
                else:
                    close_quietly(conn)
            self._slots.release()

    def _run(self, what: str, work: Callable[[Any], T], *, transactional: bool = True) -> T:
        """Run `work` (in BEGIN..COMMIT when transactional); on any driver error roll back and retry."""
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
                    raise EventStoreError(f"{what}: {_one_line(exc)}") from exc
                last = exc
                time.sleep(min(0.25, 0.003 * 2 ** min(attempt, 8)) * random.random())
            except InvalidEvent:
                raise
            except (ValueError, OverflowError) as exc:  # a stored value the connector cannot convert
                raise EventStoreError(f"{what}: unreadable value ({_one_line(exc)})") from exc
        raise ConcurrencyConflict(f"{what}: gave up after {_MAX_ATTEMPTS} attempts ({last})") from last

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                close_quietly(self._pool.get_nowait())
            except queue.Empty:
                return

    # -- schema -------------------------------------------------------------------------------

    def ensure_schema(self) -> None:
        from snowflake.connector import errors as sf_errors

        try:
            conn = self._factory()
            try:
                upgrade_snowflake(conn, self.schema)
            finally:
                close_quietly(conn)
        except (sf_errors.Error, MigrationError) as exc:
            raise EventStoreError(f"schema {self.schema!r}: migrations failed: {_one_line(exc)}") from exc

    def _merge_usable(self) -> bool:
        """Can MERGE run inside an explicit transaction? Real Snowflake: yes. fakesnow: no (its MERGE
        emulation creates a temporary table, which DuckDB refuses mid-transaction). Probed once."""
        if self._merge_in_tx is None:
            with self._probe_lock:
                if self._merge_in_tx is None:
                    self._merge_in_tx = self._probe_merge()
                    if not self._merge_in_tx:
                        log.info("schema %s: MERGE is unavailable inside transactions (fakesnow); "
                                 "using the equivalent INSERT ... WHERE NOT EXISTS", self.schema)
        return self._merge_in_tx

    def _probe_merge(self) -> bool:
        from snowflake.connector import errors as sf_errors

        with self._cursor() as cur:
            cur.execute("BEGIN")
            try:
                cur.execute(
                    f"MERGE INTO {self._t('RUN_STREAMS')} t USING (SELECT 'probe' AS RUN_ID) s"
                    " ON t.RUN_ID = s.RUN_ID AND 1 = 0"
                    " WHEN NOT MATCHED AND 1 = 0 THEN INSERT (RUN_ID, LAST_SEQ, EVENT_COUNT) VALUES (s.RUN_ID, 0, 0)"
                )
                return True
            except sf_errors.Error:
                return False
            finally:
                rollback_quietly(cur)

    # -- append -------------------------------------------------------------------------------

    def append_batch(
        self, run_id: str, events: Sequence[NewEvent], state: Any = None, *, expected_last_seq: int | None = None
    ) -> list[AppendResult]:
        valid = self._validate_append(run_id, events, state, expected_last_seq)
        if not valid:
            return []
        self._merge_usable()
        self._create_stream(run_id)
        position_base = self._position_base()
        for _ in range(_MAX_ATTEMPTS):
            projected: list[RunSnapshot] = []

            def work(cur: Any) -> list[AppendResult]:
                projected.clear()
                return self._append_tx(cur, run_id, valid, state, projected, expected_last_seq, position_base)

            results = self._run(f"append to run {run_id!r}", work)
            if not any(r.persisted for r in results) or self._committed(run_id, valid, results):
                self._remember(projected[-1] if projected else None)
                return results
            # A failed COMMIT can look like success when the connector re-sends it (a second
            # COMMIT with no open transaction succeeds), so check; the retry is idempotent.
            log.warning("run %r: append not visible after COMMIT; retrying", run_id)
        raise ConcurrencyConflict(f"append to run {run_id!r}: commit could not be confirmed")

    def _create_stream(self, run_id: str) -> None:
        """Make sure the run's stream row exists, in its own statement before the append transaction:
        a racing creator then fails here (and is retried), never at the append's COMMIT."""

        def work(cur: Any) -> None:
            cur.execute(f"SELECT COUNT(*) FROM {self._t('RUN_STREAMS')} WHERE RUN_ID = %s", (run_id,))
            if cur.fetchone()[0]:
                return
            cur.execute(
                f"MERGE INTO {self._t('RUN_STREAMS')} t USING (SELECT %s AS RUN_ID) s ON t.RUN_ID = s.RUN_ID"
                " WHEN NOT MATCHED THEN INSERT (RUN_ID, LAST_SEQ, EVENT_COUNT) VALUES (s.RUN_ID, 0, 0)",
                (run_id,),
            )

        self._run(f"create stream for run {run_id!r}", work, transactional=False)

    def _committed(self, run_id: str, valid: list[ValidEvent], results: list[AppendResult]) -> bool:
        expected = {v.idempotency_key: r.run_seq for v, r in zip(valid, results) if r.persisted}

        def work(cur: Any) -> dict[str, int]:
            return self._existing_keys(cur, run_id, sorted(expected), archived=False)

        return self._run("verify append", work, transactional=False) == expected

    def _lock_stream(self, cur: Any, run_id: str) -> tuple[int, int, bool]:
        # Writing the run's stream row is what serialises this run's appenders (see module doc).
        # The row exists (_create_stream). This no-op UPDATE is the write that serialises the run's
        # appenders: Snowflake holds the table's DML lock to COMMIT; DuckDB (fakesnow) fails the
        # second concurrent writer of the row at once, before anything else happens.
        cur.execute(f"UPDATE {self._t('RUN_STREAMS')} SET LAST_SEQ = LAST_SEQ WHERE RUN_ID = %s", (run_id,))
        if cur.rowcount != 1:
            raise Retry(f"run {run_id!r}: stream row missing")
        cur.execute(
            # The test is done in SQL: fakesnow hands NULL TIMESTAMP_TZ values back as 1970-01-01.
            f"SELECT LAST_SEQ, EVENT_COUNT, ARCHIVED_AT IS NOT NULL FROM {self._t('RUN_STREAMS')} WHERE RUN_ID = %s",
            (run_id,),
        )
        rows = cur.fetchall()
        if len(rows) != 1:
            raise Retry(f"run {run_id!r}: {len(rows)} stream rows")
        return int(rows[0][0]), int(rows[0][1]), bool(rows[0][2])

    def _existing_keys(self, cur: Any, run_id: str, keys: list[str], archived: bool) -> dict[str, int]:
        found: dict[str, int] = {}
        tables = ["RUN_EVENTS", "RUN_EVENTS_ARCHIVE"] if archived else ["RUN_EVENTS"]
        for table in tables:
            for chunk in chunks(keys, _BATCH_ROWS):
                cur.execute(
                    f"SELECT IDEMPOTENCY_KEY, RUN_SEQ FROM {self._t(table)} WHERE RUN_ID = %s AND IDEMPOTENCY_KEY IN (%s)",
                    (run_id, tuple(chunk)),
                )
                found.update({row[0]: int(row[1]) for row in cur.fetchall()})
        return found

    def _append_tx(
        self, cur: Any, run_id: str, valid: list[ValidEvent], state: Any, projected: list[RunSnapshot],
        expected: int | None, position_base: int,
    ) -> list[AppendResult]:
        last_seq, count, archived = self._lock_stream(cur, run_id)
        keys = sorted({v.idempotency_key for v in valid})
        known = self._existing_keys(cur, run_id, keys, archived) if (count or archived) else {}
        self._check_expected(run_id, valid, known, last_seq, expected)
        results, new, next_seq = self._assign_seqs(valid, known, last_seq)
        if not new:
            return results
        inserted = self._merge_events(cur, run_id, new, None, position_base)
        if inserted != len(new):
            raise Retry(f"run {run_id!r}: merged {inserted} of {len(new)} rows")  # a concurrent writer slipped in
        self._advance_stream(cur, run_id, next_seq, count + len(new), [e for _, e in new])
        reason = self.policy.reason(count, count + len(new), (e.event_type for _, e in new))
        if reason:
            made = self._write_snapshot(cur, run_id, next_seq, state, reason, last_seq, new)
            if made is not None:
                projected.append(made)
        return results

    def _merge_events(
        self, cur: Any, run_id: str, rows: Sequence[tuple[int, ValidEvent]],
        persisted_at: Sequence[datetime | None] | None, position_base: int,
    ) -> int:
        total = 0
        for start in range(0, len(rows), _BATCH_ROWS):
            chunk = rows[start:start + _BATCH_ROWS]
            params: list[Any] = []
            for offset, (seq, e) in enumerate(chunk):
                stamp = persisted_at[start + offset] if persisted_at else None
                params += [
                    run_id, seq, e.event_id, e.step_id, e.engine_attempt_id, e.logical_attempt_id, e.plan_version,
                    e.event_type, e.data_json, e.idempotency_key, e.caused_by_signal_id, e.parent_event_id,
                    e.emitted_at.isoformat(), stamp.isoformat() if stamp else None, e.adapter_version,
                    e.engine_run_ref_json, position_base + start + offset + 1,
                ]
            source = SOURCE_SELECT + ", ".join([VALUES_ROW] * len(chunk))
            if self._merge_usable():
                statement = (
                    f"MERGE INTO {self._t('RUN_EVENTS')} t USING ({source}) s"
                    " ON t.RUN_ID = s.RUN_ID AND t.IDEMPOTENCY_KEY = s.IDEMPOTENCY_KEY"
                    f" WHEN NOT MATCHED THEN INSERT ({COLUMNS}) VALUES ({S_COLUMNS})"
                )
            else:
                # The same effect as the MERGE above (insert the rows whose key is not there yet).
                statement = (
                    f"INSERT INTO {self._t('RUN_EVENTS')} ({COLUMNS}) SELECT {S_COLUMNS} FROM ({source}) s"
                    f" WHERE NOT EXISTS (SELECT 1 FROM {self._t('RUN_EVENTS')} t"
                    " WHERE t.RUN_ID = s.RUN_ID AND t.IDEMPOTENCY_KEY = s.IDEMPOTENCY_KEY)"
                )
            cur.execute(statement, params)
            total += cur.rowcount or 0
        return total

    def _position_base(self) -> int:
        """A feed token for one append, shifted: its events take the 2**20 positions above it."""

        def work(cur: Any) -> int:
            cur.execute(f"SELECT {self._t('RUN_EVENTS_POSITION_SEQ')}.NEXTVAL")
            return int(cur.fetchone()[0]) << 20

        return self._run("take a feed position", work, transactional=False)

    def _advance_stream(self, cur: Any, run_id: str, last_seq: int, count: int, events: Sequence[ValidEvent]) -> None:
        started = next((e.emitted_at for e in events if e.event_type == EventType.RUN_STARTED), None)
        completed = next((e.emitted_at for e in events if e.event_type in TERMINAL_EVENT_TYPES), None)
        cur.execute(
            f"UPDATE {self._t('RUN_STREAMS')} SET LAST_SEQ = %s, EVENT_COUNT = %s,"
            " FIRST_EVENT_AT = COALESCE(FIRST_EVENT_AT, %s::TIMESTAMP_TZ),"
            " STARTED_AT = COALESCE(STARTED_AT, %s::TIMESTAMP_TZ),"
            " COMPLETED_AT = COALESCE(COMPLETED_AT, %s::TIMESTAMP_TZ), UPDATED_AT = CURRENT_TIMESTAMP()"
            " WHERE RUN_ID = %s",
            (last_seq, count, events[0].emitted_at.isoformat(), iso(started), iso(completed), run_id),
        )


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
