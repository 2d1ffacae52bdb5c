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
cannot double-count.
"""

from __future__ import annotations

import base64
import json
import logging
import queue
import random
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from runstate.eventstore.base import _EventStoreBase
from runstate.eventstore.contract import (
    DEFAULT_MAX_EVENT_BYTES,
    TERMINAL_EVENT_TYPES,
    AppendResult,
    ConcurrencyConflict,
    EventStoreError,
    EventType,
    NewEvent,
    Resume,
    RunSnapshot,
    StoredEvent,
    ValidEvent,
)
from runstate.eventstore.projection import fold
from runstate.eventstore.rows import as_stored, validate_imported
from runstate.eventstore.snapshots import (
    KIND_PROJECTION,
    KIND_STATE,
    StoredSnapshot,
    canonical_json,
    choose_valid,
    encode_snapshot,
)
from runstate.migrations import check_schema_name, upgrade_snowflake

log = logging.getLogger("runstate.eventstore.snowflake")
T = TypeVar("T")

_MAX_ATTEMPTS = 80
_COLUMNS = (
    "RUN_ID, RUN_SEQ, EVENT_ID, STEP_ID, ENGINE_ATTEMPT_ID, LOGICAL_ATTEMPT_ID, PLAN_VERSION, EVENT_TYPE,"
    " EVENT_DATA, IDEMPOTENCY_KEY, CAUSED_BY_SIGNAL_ID, PARENT_EVENT_ID, EMITTED_AT, PERSISTED_AT,"
    " ADAPTER_VERSION, ENGINE_RUN_REF"
)
_S_COLUMNS = ", ".join(f"s.{c.strip()}" for c in _COLUMNS.split(","))
_VALUES_ROW = "(" + ", ".join(["%s"] * 16) + ")"
# column1..column16 of the VALUES source, typed; PARSE_JSON in a SELECT, never inside VALUES.
_SOURCE_SELECT = (
    "SELECT column1 AS RUN_ID, column2 AS RUN_SEQ, column3 AS EVENT_ID, column4 AS STEP_ID,"
    " column5 AS ENGINE_ATTEMPT_ID, column6 AS LOGICAL_ATTEMPT_ID, column7 AS PLAN_VERSION,"
    " column8 AS EVENT_TYPE, PARSE_JSON(column9) AS EVENT_DATA, column10 AS IDEMPOTENCY_KEY,"
    " column11 AS CAUSED_BY_SIGNAL_ID, column12 AS PARENT_EVENT_ID, column13::TIMESTAMP_TZ AS EMITTED_AT,"
    " COALESCE(column14::TIMESTAMP_TZ, CURRENT_TIMESTAMP()) AS PERSISTED_AT, column15 AS ADAPTER_VERSION,"
    " PARSE_JSON(column16) AS ENGINE_RUN_REF FROM VALUES "
)


class SnowflakeEventStore(_EventStoreBase):
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
        self._init_pool(pool_size)
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
                    _close_quietly(conn)
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
                        _rollback_quietly(cur)
                        raise
            except (sf_errors.Error, _Retry) as exc:
                if not _retryable(exc):
                    raise EventStoreError(f"{what}: {exc}") from exc
                last = exc
                time.sleep(min(0.25, 0.003 * 2 ** min(attempt, 8)) * random.random())
        raise ConcurrencyConflict(f"{what}: gave up after {_MAX_ATTEMPTS} attempts ({last})") from last

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                _close_quietly(self._pool.get_nowait())
            except queue.Empty:
                return

    # -- schema -------------------------------------------------------------------------------

    def ensure_schema(self) -> None:
        conn = self._factory()
        try:
            upgrade_snowflake(conn, self.schema)
        finally:
            _close_quietly(conn)

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
                _rollback_quietly(cur)

    # -- append -------------------------------------------------------------------------------

    def append_batch(self, run_id: str, events: Sequence[NewEvent], state: Any = None) -> list[AppendResult]:
        valid = self._validate_append(run_id, events, state)
        if not valid:
            return []
        self._merge_usable()
        self._create_stream(run_id)
        for _ in range(_MAX_ATTEMPTS):
            projected: list[RunSnapshot] = []

            def work(cur: Any) -> list[AppendResult]:
                projected.clear()
                return self._append_tx(cur, run_id, valid, state, projected)

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
            raise _Retry(f"run {run_id!r}: stream row missing")
        cur.execute(
            # The test is done in SQL: fakesnow hands NULL TIMESTAMP_TZ values back as 1970-01-01.
            f"SELECT LAST_SEQ, EVENT_COUNT, ARCHIVED_AT IS NOT NULL FROM {self._t('RUN_STREAMS')} WHERE RUN_ID = %s",
            (run_id,),
        )
        rows = cur.fetchall()
        if len(rows) != 1:
            raise _Retry(f"run {run_id!r}: {len(rows)} stream rows")
        return int(rows[0][0]), int(rows[0][1]), bool(rows[0][2])

    def _existing_keys(self, cur: Any, run_id: str, keys: list[str], archived: bool) -> dict[str, int]:
        found: dict[str, int] = {}
        tables = ["RUN_EVENTS", "RUN_EVENTS_ARCHIVE"] if archived else ["RUN_EVENTS"]
        for table in tables:
            for chunk in _chunks(keys, 1000):
                cur.execute(
                    f"SELECT IDEMPOTENCY_KEY, RUN_SEQ FROM {self._t(table)} WHERE RUN_ID = %s AND IDEMPOTENCY_KEY IN (%s)",
                    (run_id, tuple(chunk)),
                )
                found.update({row[0]: int(row[1]) for row in cur.fetchall()})
        return found

    def _append_tx(
        self, cur: Any, run_id: str, valid: list[ValidEvent], state: Any, projected: list[RunSnapshot] | None = None
    ) -> list[AppendResult]:
        last_seq, count, archived = self._lock_stream(cur, run_id)
        keys = sorted({v.idempotency_key for v in valid})
        known = self._existing_keys(cur, run_id, keys, archived) if (count or archived) else {}
        results, new, next_seq = self._assign_seqs(valid, known, last_seq)
        if not new:
            return results
        inserted = self._merge_events(cur, run_id, new, persisted_at=None)
        if inserted != len(new):
            raise _Retry(f"run {run_id!r}: merged {inserted} of {len(new)} rows")  # a concurrent writer slipped in
        self._advance_stream(cur, run_id, next_seq, count + len(new), [e for _, e in new])
        reason = self.policy.reason(count, count + len(new), (e.event_type for _, e in new))
        if reason:
            made = self._write_snapshot(cur, run_id, next_seq, state, reason, last_seq, new)
            if made is not None and projected is not None:
                projected.append(made)
        return results

    def _merge_events(
        self, cur: Any, run_id: str, rows: Sequence[tuple[int, ValidEvent]], persisted_at: Sequence[datetime | None] | None
    ) -> int:
        total = 0
        for start in range(0, len(rows), 1000):
            chunk = rows[start:start + 1000]
            params: list[Any] = []
            for offset, (seq, e) in enumerate(chunk):
                stamp = persisted_at[start + offset] if persisted_at else None
                params += [
                    run_id, seq, e.event_id, e.step_id, e.engine_attempt_id, e.logical_attempt_id, e.plan_version,
                    e.event_type, e.data_json, e.idempotency_key, e.caused_by_signal_id, e.parent_event_id,
                    e.emitted_at.isoformat(), stamp.isoformat() if stamp else None, e.adapter_version,
                    e.engine_run_ref_json,
                ]
            source = _SOURCE_SELECT + ", ".join([_VALUES_ROW] * len(chunk))
            if self._merge_usable():
                statement = (
                    f"MERGE INTO {self._t('RUN_EVENTS')} t USING ({source}) s"
                    " ON t.RUN_ID = s.RUN_ID AND t.IDEMPOTENCY_KEY = s.IDEMPOTENCY_KEY"
                    f" WHEN NOT MATCHED THEN INSERT ({_COLUMNS}) VALUES ({_S_COLUMNS})"
                )
            else:
                # The same effect as the MERGE above (insert the rows whose key is not there yet).
                statement = (
                    f"INSERT INTO {self._t('RUN_EVENTS')} ({_COLUMNS}) SELECT {_S_COLUMNS} FROM ({source}) s"
                    f" WHERE NOT EXISTS (SELECT 1 FROM {self._t('RUN_EVENTS')} t"
                    " WHERE t.RUN_ID = s.RUN_ID AND t.IDEMPOTENCY_KEY = s.IDEMPOTENCY_KEY)"
                )
            cur.execute(statement, params)
            total += cur.rowcount or 0
        return total

    def _advance_stream(self, cur: Any, run_id: str, last_seq: int, count: int, events: Sequence[ValidEvent]) -> None:
        started = next((e.emitted_at for e in events if e.event_type == EventType.RUN_STARTED), None)
        completed = next((e.emitted_at for e in events if e.event_type in TERMINAL_EVENT_TYPES), None)
        cur.execute(
            f"UPDATE {self._t('RUN_STREAMS')} SET LAST_SEQ = %s, EVENT_COUNT = %s,"
            " FIRST_EVENT_AT = COALESCE(FIRST_EVENT_AT, %s::TIMESTAMP_TZ),"
            " STARTED_AT = COALESCE(STARTED_AT, %s::TIMESTAMP_TZ),"
            " COMPLETED_AT = COALESCE(COMPLETED_AT, %s::TIMESTAMP_TZ), UPDATED_AT = CURRENT_TIMESTAMP()"
            " WHERE RUN_ID = %s",
            (last_seq, count, events[0].emitted_at.isoformat(), _iso(started), _iso(completed), run_id),
        )

    # -- snapshots ----------------------------------------------------------------------------

    def _write_snapshot(
        self, cur: Any, run_id: str, seq: int, state: Any, reason: str, stored_upto: int,
        pending: Sequence[tuple[int, ValidEvent]] = (),
    ) -> RunSnapshot | None:
        kind, projection = KIND_STATE, None
        if state is None:
            kind = KIND_PROJECTION
            projection = self._projection_in_tx(cur, run_id, stored_upto, pending)
            state = projection.to_dict()
        encoded = encode_snapshot(run_id, seq, state, self.policy)
        cur.execute(
            f"INSERT INTO {self._t('RUN_STATE_SNAPSHOTS')}"
            " (RUN_ID, SEQ, KIND, ENCODING, PAYLOAD, CHECKSUM, RAW_BYTES, STORED_BYTES, REASON)"
            " SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s WHERE NOT EXISTS ("
            f" SELECT 1 FROM {self._t('RUN_STATE_SNAPSHOTS')} WHERE RUN_ID = %s AND SEQ = %s)",
            (run_id, seq, kind, encoded.encoding, base64.b64encode(encoded.payload).decode("ascii"),
             encoded.checksum, encoded.raw_bytes, encoded.stored_bytes, reason, run_id, seq),
        )
        inserted = cur.rowcount
        cur.execute(
            f"SELECT SEQ FROM {self._t('RUN_STATE_SNAPSHOTS')} WHERE RUN_ID = %s ORDER BY SEQ DESC", (run_id,)
        )
        seqs = [int(r[0]) for r in cur.fetchall()]
        if len(seqs) > self.policy.keep:
            cur.execute(
                f"DELETE FROM {self._t('RUN_STATE_SNAPSHOTS')} WHERE RUN_ID = %s AND SEQ < %s",
                (run_id, seqs[self.policy.keep - 1]),
            )
        if inserted:
            self.metrics.record_written(encoded)
        return projection

    def _snapshots(self, cur: Any, run_id: str, *, upto: int | None = None, kind: str | None = None) -> list[StoredSnapshot]:
        query = f"SELECT RUN_ID, SEQ, KIND, ENCODING, PAYLOAD, CHECKSUM FROM {self._t('RUN_STATE_SNAPSHOTS')} WHERE RUN_ID = %s"
        params: list[Any] = [run_id]
        if upto is not None:
            query += " AND SEQ <= %s"
            params.append(upto)
        if kind is not None:
            query += " AND KIND = %s"
            params.append(kind)
        cur.execute(query + " ORDER BY SEQ DESC", params)
        return [StoredSnapshot(r[0], int(r[1]), r[2], r[3], _b64(r[4]), r[5]) for r in cur.fetchall()]

    def _projection_in_tx(self, cur: Any, run_id: str, stored_upto: int, pending: Sequence[tuple[int, ValidEvent]]) -> RunSnapshot:
        now = datetime.now(timezone.utc)
        recalled = self._recalled(run_id)
        if recalled is not None and recalled.last_event_seq <= stored_upto:
            events = self._fetch_all(cur, run_id, recalled.last_event_seq, upto=stored_upto) \
                if recalled.last_event_seq < stored_upto else []
            return fold(fold(recalled, events), (as_stored(run_id, seq, ev, now) for seq, ev in pending))
        chosen = choose_valid(run_id, self._snapshots(cur, run_id, upto=stored_upto, kind=KIND_PROJECTION), self.metrics)
        base = RunSnapshot.from_dict(chosen.state) if chosen.kind == KIND_PROJECTION else RunSnapshot.empty(run_id)
        stored = self._stored_projection(cur, run_id)
        if stored is not None and base.last_event_seq < stored.last_event_seq <= stored_upto:
            base = stored
        events = self._fetch_all(cur, run_id, base.last_event_seq, upto=stored_upto)
        now = datetime.now(timezone.utc)
        return fold(fold(base, events), (as_stored(run_id, seq, ev, now) for seq, ev in pending))

    def checkpoint(self, run_id: str, state: Any = None) -> int:
        if state is not None:
            canonical_json(run_id, state)
        self._merge_usable()

        def work(cur: Any) -> tuple[int, RunSnapshot | None]:
            cur.execute(f"SELECT COUNT(*) FROM {self._t('RUN_STREAMS')} WHERE RUN_ID = %s", (run_id,))
            if not cur.fetchone()[0]:
                return 0, None
            last_seq, _, _ = self._lock_stream(cur, run_id)
            if last_seq == 0:
                return 0, None
            return last_seq, self._write_snapshot(cur, run_id, last_seq, state, "checkpoint", last_seq)

        seq, made = self._run(f"checkpoint run {run_id!r}", work)
        self._remember(made)
        return seq

    # -- reads --------------------------------------------------------------------------------

    def fetch(self, run_id: str, after_seq: int = 0, limit: int = 1000) -> list[StoredEvent]:
        if int(limit) < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        return self._run("fetch", lambda cur: self._fetch(cur, run_id, int(after_seq), int(limit)), transactional=False)

    def _fetch(self, cur: Any, run_id: str, after_seq: int, limit: int, upto: int | None = None) -> list[StoredEvent]:
        query = f"SELECT {_COLUMNS} FROM {self._t('RUN_EVENTS')} WHERE RUN_ID = %s AND RUN_SEQ > %s"
        params: list[Any] = [run_id, after_seq]
        if upto is not None:
            query += " AND RUN_SEQ <= %s"
            params.append(upto)
        cur.execute(query + " ORDER BY RUN_SEQ LIMIT %s", params + [limit])
        return [_row_to_event(row) for row in cur.fetchall()]

    def _query(self, sql: str, params: Sequence[Any]) -> list[tuple]:
        def work(cur: Any) -> list[tuple]:
            cur.execute(sql, params)
            return cur.fetchall()

        return self._run("query", work, transactional=False)

    def run_ids(self, after: str = "", limit: int = 1000) -> list[str]:
        rows = self._query(
            f"SELECT RUN_ID FROM {self._t('RUN_STREAMS')} WHERE RUN_ID > %s ORDER BY RUN_ID LIMIT %s", (after, limit)
        )
        return [r[0] for r in rows]

    def stale_runs(self, limit: int = 1000) -> list[str]:
        rows = self._query(
            f"SELECT s.RUN_ID FROM {self._t('RUN_STREAMS')} s LEFT JOIN {self._t('RUN_SNAPSHOTS')} p"
            " ON p.RUN_ID = s.RUN_ID WHERE s.LAST_SEQ > COALESCE(p.LAST_EVENT_SEQ, 0)"
            " AND (s.ARCHIVED_AT IS NULL OR s.UPDATED_AT > s.ARCHIVED_AT) ORDER BY s.RUN_ID LIMIT %s",
            (limit,),
        )
        return [r[0] for r in rows]

    def stale_runs_with_start(self, limit: int = 1000) -> list[tuple[str, datetime | None, int]]:
        """(run_id, start, last_seq) of runs with events newer than their stored projection."""
        rows = self._query(
            # HAS_START is tested in SQL: fakesnow returns NULL TIMESTAMP_TZ values as 1970-01-01.
            f"SELECT s.RUN_ID, COALESCE(s.STARTED_AT, s.FIRST_EVENT_AT),"
            " COALESCE(s.STARTED_AT, s.FIRST_EVENT_AT) IS NOT NULL, s.LAST_SEQ"
            f" FROM {self._t('RUN_STREAMS')} s LEFT JOIN {self._t('RUN_SNAPSHOTS')} p"
            " ON p.RUN_ID = s.RUN_ID WHERE s.LAST_SEQ > COALESCE(p.LAST_EVENT_SEQ, 0)"
            " AND (s.ARCHIVED_AT IS NULL OR s.UPDATED_AT > s.ARCHIVED_AT) ORDER BY s.RUN_ID LIMIT %s",
            (limit,),
        )
        return [(r[0], r[1] if r[2] else None, int(r[3])) for r in rows]

    def runs_started_between(self, start: datetime, end: datetime) -> list[str]:
        rows = self._query(
            f"SELECT RUN_ID FROM {self._t('RUN_STREAMS')}"
            " WHERE COALESCE(STARTED_AT, FIRST_EVENT_AT) >= %s::TIMESTAMP_TZ"
            " AND COALESCE(STARTED_AT, FIRST_EVENT_AT) < %s::TIMESTAMP_TZ ORDER BY RUN_ID",
            (start.isoformat(), end.isoformat()),
        )
        return [r[0] for r in rows]

    def max_seq(self, run_id: str) -> int:
        rows = self._query(f"SELECT MAX(RUN_SEQ) FROM {self._t('RUN_EVENTS')} WHERE RUN_ID = %s", (run_id,))
        return int(rows[0][0] or 0)

    # -- projection ---------------------------------------------------------------------------

    def _stored_projection(self, cur: Any, run_id: str) -> RunSnapshot | None:
        cur.execute(f"SELECT SNAPSHOT_DATA, VERSION FROM {self._t('RUN_SNAPSHOTS')} WHERE RUN_ID = %s", (run_id,))
        row = cur.fetchone()
        return RunSnapshot.from_dict(_json(row[0]), version=int(row[1])) if row else None

    def _project(self, run_id: str) -> tuple[RunSnapshot, bool, int]:
        def work(cur: Any) -> tuple[RunSnapshot, bool, int]:
            done = self._project_once(cur, run_id)
            if done is None:
                raise _Retry("projection version moved")
            return done

        return self._run(f"project run {run_id!r}", work, transactional=False)

    def _rebuild(self, run_id: str) -> tuple[RunSnapshot, bool, int]:
        def work(cur: Any) -> tuple[RunSnapshot, bool, int]:
            done = self._rebuild_once(cur, run_id)
            if done is None:
                raise _Retry("projection version moved")
            return done

        return self._run(f"rebuild run {run_id!r}", work, transactional=False)

    def _save_projection(self, cur: Any, run_id: str, snap: RunSnapshot, stored: RunSnapshot | None) -> bool:
        data = json.dumps(snap.to_dict())
        if stored is None:
            # Outside a transaction, so MERGE runs on fakesnow too; the PK makes a racing insert fail there.
            cur.execute(
                f"MERGE INTO {self._t('RUN_SNAPSHOTS')} t USING (SELECT %s AS RUN_ID, %s AS STATUS, %s AS LAST_EVENT_SEQ,"
                " PARSE_JSON(%s) AS SNAPSHOT_DATA, %s::TIMESTAMP_TZ AS STARTED_AT, %s::TIMESTAMP_TZ AS COMPLETED_AT) s"
                " ON t.RUN_ID = s.RUN_ID WHEN NOT MATCHED THEN INSERT"
                " (RUN_ID, STATUS, LAST_EVENT_SEQ, SNAPSHOT_DATA, STARTED_AT, COMPLETED_AT, VERSION)"
                " VALUES (s.RUN_ID, s.STATUS, s.LAST_EVENT_SEQ, s.SNAPSHOT_DATA, s.STARTED_AT, s.COMPLETED_AT, 1)",
                (run_id, snap.status, snap.last_event_seq, data, _iso(snap.started_at), _iso(snap.completed_at)),
            )
            return cur.rowcount == 1
        cur.execute(
            f"UPDATE {self._t('RUN_SNAPSHOTS')} SET STATUS = %s, LAST_EVENT_SEQ = %s, SNAPSHOT_DATA = PARSE_JSON(%s),"
            " STARTED_AT = %s::TIMESTAMP_TZ, COMPLETED_AT = %s::TIMESTAMP_TZ, PROJECTED_AT = CURRENT_TIMESTAMP(),"
            " VERSION = %s WHERE RUN_ID = %s AND VERSION = %s",
            (snap.status, snap.last_event_seq, data, _iso(snap.started_at), _iso(snap.completed_at),
             stored.version + 1, run_id, stored.version),
        )
        return cur.rowcount == 1

    def resume(self, run_id: str) -> Resume:
        started = time.perf_counter()

        def work(cur: Any) -> Resume:
            chosen = choose_valid(run_id, self._snapshots(cur, run_id), self.metrics)
            events = self._fetch_all(cur, run_id, chosen.seq)
            return Resume(chosen.state, chosen.seq, events, chosen.kind, chosen.fallbacks)

        return self._record_resume(run_id, self._run(f"resume run {run_id!r}", work, transactional=False), started)

    # -- archival and import ------------------------------------------------------------------

    def archive(self, older_than_days: int, now: datetime | None = None, *, batch_runs: int = 200) -> int:
        """Move events of runs finished > N days ago into RUN_EVENTS_ARCHIVE, a transaction per chunk."""
        cutoff = self._archive_cutoff(older_than_days, now).isoformat()

        def chunk(cur: Any) -> tuple[int, int]:
            cur.execute(
                f"SELECT RUN_ID FROM {self._t('RUN_STREAMS')} WHERE COMPLETED_AT < %s::TIMESTAMP_TZ"
                " AND (ARCHIVED_AT IS NULL OR UPDATED_AT > ARCHIVED_AT) ORDER BY RUN_ID LIMIT %s",
                (cutoff, batch_runs),
            )
            runs = tuple(r[0] for r in cur.fetchall())
            if not runs:
                return 0, 0
            # Touch the stream rows first: appenders to these runs now conflict with us, not interleave.
            cur.execute(
                f"UPDATE {self._t('RUN_STREAMS')} SET ARCHIVED_AT = CURRENT_TIMESTAMP() WHERE RUN_ID IN (%s)", (runs,)
            )
            cur.execute(
                f"INSERT INTO {self._t('RUN_EVENTS_ARCHIVE')} ({_COLUMNS}) SELECT {_COLUMNS.replace('RUN_ID,', 'e.RUN_ID,', 1)}"
                f" FROM {self._t('RUN_EVENTS')} e WHERE e.RUN_ID IN (%s) AND NOT EXISTS ("
                f" SELECT 1 FROM {self._t('RUN_EVENTS_ARCHIVE')} a WHERE a.RUN_ID = e.RUN_ID AND a.RUN_SEQ = e.RUN_SEQ)",
                (runs,),
            )
            cur.execute(f"DELETE FROM {self._t('RUN_EVENTS')} WHERE RUN_ID IN (%s)", (runs,))
            moved = cur.rowcount or 0
            cur.execute(f"DELETE FROM {self._t('RUN_STATE_SNAPSHOTS')} WHERE RUN_ID IN (%s)", (runs,))
            return len(runs), moved

        return self._archive_chunks(chunk, batch_runs)

    def import_events(self, events: Iterable[StoredEvent]) -> int:
        """Insert stored events keeping run_seq and persisted_at; keys already present are skipped."""
        by_run = self._by_run(events)
        written = 0
        if by_run:
            self._merge_usable()
        for run_id, run_events in by_run.items():
            valid = validate_imported(run_id, run_events, self.max_event_bytes)
            stamps = {e.run_seq: e.persisted_at for e in run_events}
            self._create_stream(run_id)
            expected = {v.idempotency_key: seq for seq, v in valid}
            for _ in range(_MAX_ATTEMPTS):
                written += self._run(
                    f"import into run {run_id!r}", lambda cur: self._import_tx(cur, run_id, valid, stamps)
                )
                found = self._run("verify import", lambda cur: self._existing_keys(cur, run_id, sorted(expected), False),
                                  transactional=False)
                if found == expected:
                    break
                log.warning("run %r: import not visible after COMMIT; retrying", run_id)
            else:
                raise ConcurrencyConflict(f"import into run {run_id!r}: commit could not be confirmed")
        return written

    def _import_tx(self, cur: Any, run_id: str, valid: list[tuple[int, ValidEvent]], stamps: dict[int, datetime]) -> int:
        last_seq, count, archived = self._lock_stream(cur, run_id)
        keys = self._existing_keys(cur, run_id, [v.idempotency_key for _, v in valid], archived)
        taken: set[int] = set()
        for chunk in _chunks([s for s, _ in valid], 1000):
            cur.execute(
                f"SELECT RUN_SEQ FROM {self._t('RUN_EVENTS')} WHERE RUN_ID = %s AND RUN_SEQ IN (%s)", (run_id, tuple(chunk))
            )
            taken.update(int(r[0]) for r in cur.fetchall())
        fresh = self._fresh_imports(run_id, valid, keys, taken)
        if not fresh:
            return 0
        inserted = self._merge_events(cur, run_id, fresh, persisted_at=[stamps.get(s) for s, _ in fresh])
        if inserted != len(fresh):
            raise _Retry(f"run {run_id!r}: merged {inserted} of {len(fresh)} imported rows")
        self._advance_stream(cur, run_id, max(last_seq, max(s for s, _ in fresh)), count + len(fresh), [e for _, e in fresh])
        return len(fresh)


class _Retry(Exception):
    """Internal: the transaction saw a race and must be retried from the start."""


_RETRY_WORDS = ("conflict", "lock", "aborted", "deadlock", "duplicate key", "timeout", "timed out")


def _retryable(exc: BaseException) -> bool:
    """Races and transient failures: ours (_Retry), Snowflake lock/abort errors, and fakesnow's
    HTTP 500 (how its server reports a DuckDB write-write conflict)."""
    from snowflake.connector import errors as sf_errors

    if isinstance(exc, (_Retry, sf_errors.InternalServerError, sf_errors.OperationalError, sf_errors.ServiceUnavailableError)):
        return True
    return any(word in str(exc).lower() for word in _RETRY_WORDS)


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _b64(value: Any) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (ValueError, TypeError):
        return b""  # undecodable payload: the checksum check reports it as corrupt


def _row_to_event(row: Sequence[Any]) -> StoredEvent:
    (run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version, event_type,
     data, key, caused_by, parent, emitted_at, persisted_at, adapter_version, ref) = row
    return StoredEvent(
        run_id=run_id, run_seq=int(run_seq), event_type=event_type, emitted_at=emitted_at, persisted_at=persisted_at,
        idempotency_key=key, event_id=event_id, data=_json(data) if data is not None else None, step_id=step_id,
        engine_attempt_id=engine_attempt_id, logical_attempt_id=logical_attempt_id, plan_version=plan_version,
        caused_by_signal_id=caused_by, parent_event_id=parent, adapter_version=adapter_version,
        engine_run_ref=_json(ref) if ref is not None else None,
    )


def _rollback_quietly(cur: Any) -> None:
    try:
        cur.execute("ROLLBACK")
    except Exception:  # the connection is already unusable; the pool drops it
        pass


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:
        pass
