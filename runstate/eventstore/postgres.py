"""PostgresEventStore: the run state store on PostgreSQL (seed 001).

- run_seq comes from the run's row in `run_streams`, locked by an upsert in the append
  transaction: writers to one run serialise on that row only, writers to other runs never wait.
- `append_batch` is one transaction: lock the stream row, look up existing keys, insert every new
  row in ONE statement (`unnest` of arrays) that also advances the stream, and, when the event
  count crosses a multiple of `snapshot_interval` (or the batch has SignalWaiting), write a state
  snapshot and prune old ones.
- Hash partitioning: `partitions=N` creates run_events PARTITION BY HASH (run_id) on first
  ensure_schema (see sql/postgres/001_eventstore.sql).
- Retries: serialization failures, deadlocks and unique-key races re-run the whole transaction
  with jittered backoff; a dropped connection is retried twice. A retry after a COMMIT whose
  outcome was lost reports those events as `idempotent=True, persisted=False`: the log itself
  holds each key once either way (at-least-once reporting, exactly-once storage).
- Archived runs keep their stream row, so run_seq continues and keys in run_events_archive still
  count as duplicates.
"""

from __future__ import annotations

import json
import logging
import queue
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import psycopg
from psycopg import errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo

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
from runstate.eventstore.rows import as_stored as _as_stored, validate_imported as _validate_imported
from runstate.eventstore.projection import READS_DATA, fold
from runstate.eventstore.snapshots import (
    KIND_PROJECTION,
    KIND_STATE,
    ChosenSnapshot,
    StoredSnapshot,
    canonical_json,
    choose_valid,
    encode_snapshot,
)
from runstate.migrations import check_schema_name, upgrade_postgres

log = logging.getLogger("runstate.eventstore.postgres")
T = TypeVar("T")

_RETRYABLE = (errors.SerializationFailure, errors.DeadlockDetected, errors.UniqueViolation)
_MAX_ATTEMPTS = 20

EVENT_COLUMNS = (
    "run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version, event_type,"
    " event_data, idempotency_key, caused_by_signal_id, parent_event_id, emitted_at, persisted_at,"
    " adapter_version, engine_run_ref"
)

# One statement inserts every new row of a batch and advances the run's stream row. The arrays go
# as binary parameters (%(x)b): no text escaping of every element on the client.
_INSERT_BATCH = """
WITH rows AS (
  SELECT * FROM unnest(
    %(seq)b::bigint[], %(event_id)b::uuid[], %(step_id)b::text[], %(engine_attempt_id)b::text[],
    %(logical_attempt_id)b::text[], %(plan_version)b::text[], %(event_type)b::text[], %(data)b::text[],
    %(key)b::text[], %(caused_by)b::uuid[], %(parent)b::uuid[], %(emitted_at)b::timestamptz[],
    %(adapter_version)b::text[], %(ref)b::text[]
  ) AS u(seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version, event_type, data,
         key, caused_by, parent, emitted_at, adapter_version, ref)
), inserted AS (
  INSERT INTO run_events (run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id,
                          plan_version, event_type, event_data, idempotency_key, caused_by_signal_id,
                          parent_event_id, emitted_at, adapter_version, engine_run_ref)
  SELECT %(run_id)s, seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version,
         event_type, data::jsonb, key, caused_by, parent, emitted_at, adapter_version, ref::jsonb
  FROM rows
  {on_conflict}
  RETURNING 1
)
UPDATE run_streams
   SET last_seq = GREATEST(last_seq, %(last_seq)s),
       event_count = event_count + (SELECT count(*) FROM inserted),
       first_event_at = COALESCE(first_event_at, %(first_event_at)s),
       started_at = COALESCE(started_at, %(started_at)s),
       completed_at = COALESCE(completed_at, %(completed_at)s),
       updated_at = now()
 WHERE run_id = %(run_id)s
RETURNING event_count, (SELECT count(*) FROM inserted)
"""
# append_batch inserts optimistically: a key already stored is skipped here (and counted as missing
# from `inserted`) instead of probed for beforehand, which saves a statement (~0.75 ms of the ~8 ms
# a 100-event batch took) on every batch; a short count sends the batch down the probing path
# (see _KeyTaken).
_INSERT_NEW = _INSERT_BATCH.replace("{on_conflict}", "ON CONFLICT (run_id, idempotency_key) DO NOTHING")
# import_events probes keys and run_seqs first; a key inserted by a racing writer is a UniqueViolation (retried).
_INSERT_BATCH = _INSERT_BATCH.replace("{on_conflict}", "")


class _KeyTaken(Exception):
    """The optimistic insert found an idempotency key already stored: roll back, append with the probe."""


@dataclass(frozen=True)
class _Stream:
    last_seq: int
    event_count: int
    archived: bool


class PostgresEventStore(_EventStoreBase):
    """The event store on Postgres; thread-safe (a small internal connection pool)."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "runstate",
        snapshot_interval: int = 100,
        keep_snapshots: int = 3,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        partitions: int = 0,
        pool_size: int = 8,
        large_snapshot_bytes: int = 100 * 1024,
    ):
        self.schema = check_schema_name(schema)
        if int(partitions) < 0 or int(partitions) > 1024:
            raise ValueError(f"partitions must be between 0 and 1024, got {partitions!r}")
        if int(max_event_bytes) < 1:
            raise ValueError(f"max_event_bytes must be positive, got {max_event_bytes!r}")
        self.partitions = int(partitions)
        self._init_policy(
            max_event_bytes=max_event_bytes, snapshot_interval=snapshot_interval,
            keep_snapshots=keep_snapshots, large_snapshot_bytes=large_snapshot_bytes,
        )
        self._dsn = dsn
        self._conninfo = _with_search_path(dsn, self.schema)
        self._init_pool(pool_size)
        self._init_recent()

    # -- connections --------------------------------------------------------------------------

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        if self._closed:
            raise EventStoreError("the event store is closed")
        self._slots.acquire()
        conn = None
        try:
            try:
                conn = self._pool.get_nowait()
            except queue.Empty:
                conn = psycopg.connect(self._conninfo, autocommit=True)
            if conn.closed:
                conn = psycopg.connect(self._conninfo, autocommit=True)
            yield conn
        except psycopg.OperationalError:
            if conn is not None:
                conn.close()
            conn = None
            raise
        finally:
            if conn is not None and not conn.closed and conn.info.transaction_status == 0:
                self._pool.put(conn)
            elif conn is not None:
                conn.close()
            self._slots.release()

    def _run(self, what: str, work: Callable[[psycopg.Connection], T], *, transactional: bool = True) -> T:
        """Run `work` in a transaction, retrying serialisation/deadlock/unique races with backoff."""
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            try:
                with self._connection() as conn:
                    if not transactional:
                        return work(conn)
                    with conn.transaction():
                        return work(conn)
            except _RETRYABLE as exc:
                if attempt == _MAX_ATTEMPTS:
                    raise ConcurrencyConflict(f"{what}: gave up after {attempt} attempts ({exc})") from exc
                time.sleep(min(0.2, 0.002 * 2 ** attempt) * random.random())
            except psycopg.OperationalError as exc:
                if attempt >= 3:
                    raise EventStoreError(f"{what}: database unavailable ({exc})") from exc
                time.sleep(0.05 * attempt)
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                self._pool.get_nowait().close()
            except queue.Empty:
                return

    # -- schema -------------------------------------------------------------------------------

    def ensure_schema(self) -> None:
        """Apply the versioned migrations into `schema`; idempotent and safe to race."""
        options = f"-c runstate.event_partitions={self.partitions}"
        upgrade_postgres(_add_options(self._dsn, options), self.schema)
        if self.partitions:
            with self._connection() as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_inherits WHERE inhparent = to_regclass(%s)",
                    (f"{self.schema}.run_events",),
                ).fetchone()
            if row[0] != self.partitions:
                raise ValueError(
                    f"schema {self.schema!r}: run_events already exists with {row[0]} hash partitions, "
                    f"not {self.partitions}; partitioning is chosen when the table is first created"
                )

    # -- append -------------------------------------------------------------------------------

    def append_batch(self, run_id: str, events: Sequence[NewEvent], state: Any = None) -> list[AppendResult]:
        """Append atomically; duplicates (stored or within the batch) return the existing run_seq."""
        valid = self._validate_append(run_id, events, state)
        if not valid:
            return []
        projected: list[RunSnapshot] = []

        def work(conn: psycopg.Connection, probe: bool) -> list[AppendResult]:
            projected.clear()
            return self._append_tx(conn, run_id, valid, state, projected, probe=probe)

        what = f"append to run {run_id!r}"
        try:
            results = self._run(what, lambda conn: work(conn, False))
        except _KeyTaken:  # a retried batch: the rollback undid everything, look the stored keys up first
            results = self._run(what, lambda conn: work(conn, True))
        self._remember(projected[-1] if projected else None)  # only once the transaction committed
        return results

    def _lock_stream(self, conn: psycopg.Connection, run_id: str) -> _Stream:
        # The upsert takes the row lock that serialises this run's writers (and only them).
        row = conn.execute(
            "INSERT INTO run_streams (run_id) VALUES (%s)"
            " ON CONFLICT (run_id) DO UPDATE SET updated_at = run_streams.updated_at"
            " RETURNING last_seq, event_count, archived_at IS NOT NULL",
            (run_id,),
        ).fetchone()
        return _Stream(row[0], row[1], row[2])

    def _existing_keys(self, conn: psycopg.Connection, run_id: str, keys: list[str], stream: _Stream) -> dict[str, int]:
        if stream.event_count == 0 and not stream.archived:
            return {}
        # Probe the (run_id, idempotency_key) index once per key: `= ANY(array)` lets the planner
        # scan the whole run and filter, which grows with the run's length.
        query = ("SELECT e.idempotency_key, e.run_seq FROM unnest(%(keys)s::text[]) AS k(key)"
                 " JOIN run_events e ON e.run_id = %(run_id)s AND e.idempotency_key = k.key")
        if stream.archived:
            query += (" UNION ALL SELECT a.idempotency_key, a.run_seq FROM unnest(%(keys)s::text[]) AS k(key)"
                      " JOIN run_events_archive a ON a.run_id = %(run_id)s AND a.idempotency_key = k.key")
        return dict(conn.execute(query, {"keys": keys, "run_id": run_id}).fetchall())

    def _append_tx(
        self, conn: psycopg.Connection, run_id: str, valid: list[ValidEvent], state: Any,
        projected: list[RunSnapshot] | None = None, *, probe: bool = False,
    ) -> list[AppendResult]:
        stream = self._lock_stream(conn, run_id)
        # Archived keys live in run_events_archive, which the insert's ON CONFLICT cannot see: probe those.
        known: dict[str, int] = {}
        if probe or stream.archived:
            known = self._existing_keys(conn, run_id, sorted({v.idempotency_key for v in valid}), stream)
        results, new, next_seq = self._assign_seqs(valid, known, stream.last_seq)
        if not new:
            return results
        _, inserted = conn.execute(_INSERT_NEW, _batch_params(run_id, new, next_seq)).fetchone()
        if inserted != len(new):
            # Only possible without the probe (the stream row lock keeps racing writers out of this run).
            raise _KeyTaken()
        reason = self.policy.reason(stream.event_count, stream.event_count + len(new), (e.event_type for _, e in new))
        if reason:
            made = self._write_snapshot(conn, run_id, next_seq, state, reason, stream.last_seq, new)
            if made is not None and projected is not None:
                projected.append(made)
        return results

    # -- snapshots ----------------------------------------------------------------------------

    def _write_snapshot(
        self,
        conn: psycopg.Connection,
        run_id: str,
        seq: int,
        state: Any,
        reason: str,
        stored_upto: int,
        pending: Sequence[tuple[int, ValidEvent]] = (),
    ) -> RunSnapshot | None:
        """Write the snapshot at `seq` (state, or the projection) and keep only the latest N, in one
        statement; returns the projection when that is what was written."""
        kind, projection = KIND_STATE, None
        if state is None:
            kind = KIND_PROJECTION
            projection = self._projection_in_tx(conn, run_id, stored_upto, pending)
            state = projection.to_dict()
        encoded = encode_snapshot(run_id, seq, state, self.policy)
        # The DELETE sees the table as it was before the INSERT (one snapshot per statement): keep
        # the newest keep-1 older snapshots next to the new one.
        inserted = conn.execute(
            "WITH added AS ("
            " INSERT INTO run_state_snapshots"
            " (run_id, seq, kind, encoding, payload, checksum, raw_bytes, stored_bytes, reason)"
            " VALUES (%(run_id)s, %(seq)s, %(kind)s, %(encoding)s, %(payload)s, %(checksum)s, %(raw)s, %(stored)s,"
            " %(reason)s) ON CONFLICT (run_id, seq) DO NOTHING RETURNING 1),"
            " pruned AS (DELETE FROM run_state_snapshots WHERE run_id = %(run_id)s AND seq < %(seq)s AND seq NOT IN ("
            "  SELECT seq FROM run_state_snapshots WHERE run_id = %(run_id)s AND seq < %(seq)s"
            "  ORDER BY seq DESC LIMIT %(older)s))"
            " SELECT count(*) FROM added",
            {"run_id": run_id, "seq": seq, "kind": kind, "encoding": encoded.encoding, "payload": encoded.payload,
             "checksum": encoded.checksum, "raw": encoded.raw_bytes, "stored": encoded.stored_bytes,
             "reason": reason, "older": self.policy.keep - 1},
        ).fetchone()[0]
        if inserted:
            self.metrics.record_written(encoded)
        return projection

    def _projection_in_tx(
        self, conn: psycopg.Connection, run_id: str, stored_upto: int, pending: Sequence[tuple[int, ValidEvent]]
    ) -> RunSnapshot:
        """The run's projection through the stored events up to `stored_upto` plus `pending` ones."""
        recalled = self._recalled(run_id)
        if recalled is not None and recalled.last_event_seq <= stored_upto:
            base = recalled
        else:
            base = self._latest_projection_base(conn, run_id, stored_upto)
        now = datetime.now(timezone.utc)
        if base.last_event_seq != stored_upto:
            base = fold(base, self._fetch_all(conn, run_id, base.last_event_seq, upto=stored_upto))
        return fold(base, (_pending_for_fold(run_id, seq, ev, now) for seq, ev in pending))

    def _latest_projection_base(self, conn: psycopg.Connection, run_id: str, upto: int) -> RunSnapshot:
        rows = conn.execute(
            "SELECT run_id, seq, kind, encoding, payload, checksum FROM run_state_snapshots"
            " WHERE run_id = %s AND kind = 'projection' AND seq <= %s ORDER BY seq DESC",
            (run_id, upto),
        ).fetchall()
        chosen = choose_valid(run_id, [StoredSnapshot(r[0], r[1], r[2], r[3], bytes(r[4]), r[5]) for r in rows], self.metrics)
        best = RunSnapshot.from_dict(chosen.state) if chosen.kind == KIND_PROJECTION else RunSnapshot.empty(run_id)
        row = conn.execute(
            "SELECT snapshot_data FROM run_snapshots WHERE run_id = %s AND last_event_seq <= %s", (run_id, upto)
        ).fetchone()
        if row is not None:
            projected = RunSnapshot.from_dict(row[0])
            if projected.last_event_seq > best.last_event_seq:
                best = projected
        return best

    def checkpoint(self, run_id: str, state: Any = None) -> int:
        """Manual snapshot at the run's latest run_seq; returns that seq (0: the run has no events)."""
        if state is not None:
            canonical_json(run_id, state)

        def work(conn: psycopg.Connection) -> tuple[int, RunSnapshot | None]:
            row = conn.execute("SELECT last_seq FROM run_streams WHERE run_id = %s FOR UPDATE", (run_id,)).fetchone()
            if row is None or row[0] == 0:
                return 0, None
            made = self._write_snapshot(conn, run_id, row[0], state, "checkpoint", row[0])
            return row[0], made

        seq, made = self._run(f"checkpoint run {run_id!r}", work)
        self._remember(made)
        return seq

    # -- reads --------------------------------------------------------------------------------

    def fetch(self, run_id: str, after_seq: int = 0, limit: int = 1000) -> list[StoredEvent]:
        """Events with run_seq > after_seq, ascending, at most `limit` (the watermark pattern)."""
        if int(limit) < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        with self._connection() as conn:
            return self._fetch(conn, run_id, int(after_seq), int(limit))

    def _fetch(self, conn: psycopg.Connection, run_id: str, after_seq: int, limit: int, upto: int | None = None) -> list[StoredEvent]:
        if upto is None:
            rows = conn.execute(
                f"SELECT {EVENT_COLUMNS} FROM run_events WHERE run_id = %s AND run_seq > %s ORDER BY run_seq LIMIT %s",
                (run_id, after_seq, limit),
            ).fetchall()
        else:
            rows = conn.execute(
                f"SELECT {EVENT_COLUMNS} FROM run_events WHERE run_id = %s AND run_seq > %s AND run_seq <= %s"
                " ORDER BY run_seq LIMIT %s",
                (run_id, after_seq, upto, limit),
            ).fetchall()
        return [_row_to_event(row) for row in rows]

    def run_ids(self, after: str = "", limit: int = 1000) -> list[str]:
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT run_id FROM run_streams WHERE run_id > %s ORDER BY run_id LIMIT %s", (after, limit)
            ).fetchall()
        return [r[0] for r in rows]

    def max_seq(self, run_id: str) -> int:
        """The highest run_seq stored for the run (0 when none): the migration's resume point."""
        with self._connection() as conn:
            return conn.execute("SELECT COALESCE(MAX(run_seq), 0) FROM run_events WHERE run_id = %s", (run_id,)).fetchone()[0]

    def stale_runs(self, limit: int = 1000) -> list[str]:
        """Runs with events newer than their stored projection."""
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT s.run_id FROM run_streams s LEFT JOIN run_snapshots p ON p.run_id = s.run_id"
                " WHERE s.last_seq > COALESCE(p.last_event_seq, 0)"
                "   AND (s.archived_at IS NULL OR s.updated_at > s.archived_at)"
                " ORDER BY s.run_id LIMIT %s",
                (limit,),
            ).fetchall()
        return [r[0] for r in rows]

    def stale_runs_with_start(self, limit: int = 1000) -> list[tuple[str, datetime | None, int]]:
        """(run_id, start, last_seq) of runs with events newer than their stored projection; the start
        is the RunStarted event's emitted_at, else the first event's."""
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT s.run_id, COALESCE(s.started_at, s.first_event_at), s.last_seq"
                " FROM run_streams s LEFT JOIN run_snapshots p ON p.run_id = s.run_id"
                " WHERE s.last_seq > COALESCE(p.last_event_seq, 0)"
                "   AND (s.archived_at IS NULL OR s.updated_at > s.archived_at)"
                " ORDER BY s.run_id LIMIT %s",
                (limit,),
            ).fetchall()
        return [(r[0], r[1], r[2]) for r in rows]

    def runs_started_between(self, start: datetime, end: datetime) -> list[str]:
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT run_id FROM run_streams WHERE COALESCE(started_at, first_event_at) >= %s"
                " AND COALESCE(started_at, first_event_at) < %s ORDER BY run_id",
                (start, end),
            ).fetchall()
        return [r[0] for r in rows]

    # -- projection ---------------------------------------------------------------------------

    def _project(self, run_id: str) -> tuple[RunSnapshot, bool, int]:
        return self._until_saved("project", self._project_once, run_id)

    def _rebuild(self, run_id: str) -> tuple[RunSnapshot, bool, int]:
        return self._until_saved("rebuild", self._rebuild_once, run_id)

    def _until_saved(
        self, what: str, attempt: Callable[[psycopg.Connection, str], tuple[RunSnapshot, bool, int] | None], run_id: str
    ) -> tuple[RunSnapshot, bool, int]:
        """Retry a compare-and-set projection step on a fresh read until it wins."""
        for _ in range(_MAX_ATTEMPTS):
            with self._connection() as conn:
                done = attempt(conn, run_id)
                if done is not None:
                    return done
        raise ConcurrencyConflict(f"{what} run {run_id!r}: the stored snapshot kept changing")

    def _stored_projection(self, conn: psycopg.Connection, run_id: str) -> RunSnapshot | None:
        row = conn.execute("SELECT snapshot_data, version FROM run_snapshots WHERE run_id = %s", (run_id,)).fetchone()
        return RunSnapshot.from_dict(row[0], version=row[1]) if row else None

    def _save_projection(self, conn: psycopg.Connection, run_id: str, snap: RunSnapshot, stored: RunSnapshot | None) -> bool:
        """Compare-and-set on version; False when another projector won (the caller re-reads)."""
        params = {
            "run_id": run_id, "status": snap.status, "seq": snap.last_event_seq,
            "data": json.dumps(snap.to_dict()), "started": snap.started_at, "completed": snap.completed_at,
        }
        if stored is None:
            return conn.execute(
                "INSERT INTO run_snapshots (run_id, status, last_event_seq, snapshot_data, started_at, completed_at, version)"
                " VALUES (%(run_id)s, %(status)s, %(seq)s, %(data)s::jsonb, %(started)s, %(completed)s, 1)"
                " ON CONFLICT (run_id) DO NOTHING",
                params,
            ).rowcount == 1
        return conn.execute(
            "UPDATE run_snapshots SET status = %(status)s, last_event_seq = %(seq)s, snapshot_data = %(data)s::jsonb,"
            " started_at = %(started)s, completed_at = %(completed)s, projected_at = now(), version = version + 1"
            " WHERE run_id = %(run_id)s AND version = %(version)s",
            {**params, "version": stored.version},
        ).rowcount == 1

    def resume(self, run_id: str) -> Resume:
        """The latest valid state snapshot plus the events after it (older / full replay on corruption)."""
        started = time.perf_counter()
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT run_id, seq, kind, encoding, payload, checksum FROM run_state_snapshots"
                " WHERE run_id = %s ORDER BY seq DESC",
                (run_id,),
            ).fetchall()
            chosen: ChosenSnapshot = choose_valid(
                run_id, [StoredSnapshot(r[0], r[1], r[2], r[3], bytes(r[4]), r[5]) for r in rows], self.metrics
            )
            events = self._fetch_all(conn, run_id, chosen.seq)
        return self._record_resume(run_id, Resume(chosen.state, chosen.seq, events, chosen.kind, chosen.fallbacks), started)

    # -- archival and import ------------------------------------------------------------------

    def archive(self, older_than_days: int, now: datetime | None = None, *, batch_runs: int = 500) -> int:
        """Move the events of runs finished more than N days ago to run_events_archive.

        Each chunk of runs moves in one transaction (DELETE ... RETURNING feeding the INSERT), so an
        event is in exactly one of the two tables; a second call finds nothing left to move.
        """
        cutoff = self._archive_cutoff(older_than_days, now)

        def chunk(conn: psycopg.Connection) -> tuple[int, int]:
            runs = [r[0] for r in conn.execute(
                "SELECT run_id FROM run_streams WHERE completed_at < %s"
                " AND (archived_at IS NULL OR updated_at > archived_at)"
                " ORDER BY run_id LIMIT %s FOR UPDATE",
                (cutoff, batch_runs),
            ).fetchall()]
            if not runs:
                return 0, 0
            moved = conn.execute(
                f"WITH moved AS (DELETE FROM run_events WHERE run_id = ANY(%s) RETURNING {EVENT_COLUMNS}),"
                f" kept AS (INSERT INTO run_events_archive ({EVENT_COLUMNS}) SELECT {EVENT_COLUMNS} FROM moved"
                " ON CONFLICT DO NOTHING RETURNING 1)"
                " SELECT count(*) FROM moved",
                (runs,),
            ).fetchone()[0]
            conn.execute("DELETE FROM run_state_snapshots WHERE run_id = ANY(%s)", (runs,))
            conn.execute(
                "UPDATE run_streams SET archived_at = now() WHERE run_id = ANY(%s)",
                (runs,),
            )
            return len(runs), moved

        return self._archive_chunks(chunk, batch_runs)

    def import_events(self, events: Iterable[StoredEvent]) -> int:
        """Insert stored events keeping their run_seq (migration); already-present keys are skipped."""
        written = 0
        for run_id, run_events in self._by_run(events).items():
            valid = _validate_imported(run_id, run_events, self.max_event_bytes)
            written += self._run(f"import into run {run_id!r}", lambda conn: self._import_tx(conn, run_id, valid))
        return written

    def _import_tx(self, conn: psycopg.Connection, run_id: str, valid: list[tuple[int, ValidEvent]]) -> int:
        stream = self._lock_stream(conn, run_id)
        keys = self._existing_keys(conn, run_id, [v.idempotency_key for _, v in valid], stream)
        taken = {r[0] for r in conn.execute(
            "SELECT run_seq FROM run_events WHERE run_id = %s AND run_seq = ANY(%s)", (run_id, [s for s, _ in valid])
        ).fetchall()}
        fresh = self._fresh_imports(run_id, valid, keys, taken)
        if fresh:
            top = max(stream.last_seq, max(seq for seq, _ in fresh))
            conn.execute(_INSERT_BATCH, _batch_params(run_id, fresh, top))
        return len(fresh)


# -- helpers ------------------------------------------------------------------------------------


def _with_search_path(dsn: str, schema: str) -> str:
    return _add_options(dsn, f"-c search_path={schema},public")


def _add_options(dsn: str, options: str) -> str:
    existing = conninfo_to_dict(dsn).get("options")
    return make_conninfo(dsn, options=f"{existing} {options}" if existing else options)


def _first(events: Iterable[ValidEvent], types: frozenset[str] | None) -> datetime | None:
    for event in events:
        if types is None or event.event_type in types:
            return event.emitted_at
    return None


def _batch_params(run_id: str, new: Sequence[tuple[int, ValidEvent]], last_seq: int) -> dict[str, Any]:
    events = [e for _, e in new]
    return {
        "run_id": run_id,
        "seq": [s for s, _ in new],
        "event_id": [e.event_id for e in events],
        "step_id": [e.step_id for e in events],
        "engine_attempt_id": [e.engine_attempt_id for e in events],
        "logical_attempt_id": [e.logical_attempt_id for e in events],
        "plan_version": [e.plan_version for e in events],
        "event_type": [e.event_type for e in events],
        "data": [e.data_json for e in events],
        "key": [e.idempotency_key for e in events],
        "caused_by": [e.caused_by_signal_id for e in events],
        "parent": [e.parent_event_id for e in events],
        "emitted_at": [e.emitted_at for e in events],
        "adapter_version": [e.adapter_version for e in events],
        "ref": [e.engine_run_ref_json for e in events],
        "last_seq": last_seq,
        "first_event_at": events[0].emitted_at,
        "started_at": _first(events, frozenset({EventType.RUN_STARTED})),
        "completed_at": _first(events, TERMINAL_EVENT_TYPES),
    }


def _pending_for_fold(run_id: str, seq: int, event: ValidEvent, now: datetime) -> StoredEvent:
    """The event as `fold` sees it; `data` is decoded only for the types whose handler reads it
    (JSON-decoding every event of a batch was a large part of an interval snapshot's cost)."""
    if event.event_type in READS_DATA:
        return _as_stored(run_id, seq, event, now)
    return StoredEvent(
        run_id=run_id, run_seq=seq, event_type=event.event_type, emitted_at=event.emitted_at, persisted_at=now,
        idempotency_key=event.idempotency_key, event_id=event.event_id, data=None, step_id=event.step_id,
        engine_attempt_id=event.engine_attempt_id, logical_attempt_id=event.logical_attempt_id,
        plan_version=event.plan_version, caused_by_signal_id=event.caused_by_signal_id,
        parent_event_id=event.parent_event_id, adapter_version=event.adapter_version, engine_run_ref=None,
    )


def _row_to_event(row: Sequence[Any]) -> StoredEvent:
    (run_id, run_seq, event_id, step_id, engine_attempt_id, logical_attempt_id, plan_version, event_type,
     data, key, caused_by, parent, emitted_at, persisted_at, adapter_version, ref) = row
    return StoredEvent(
        run_id=run_id, run_seq=run_seq, event_type=event_type, emitted_at=emitted_at, persisted_at=persisted_at,
        idempotency_key=key, event_id=str(event_id), data=data, step_id=step_id,
        engine_attempt_id=engine_attempt_id, logical_attempt_id=logical_attempt_id, plan_version=plan_version,
        caused_by_signal_id=str(caused_by) if caused_by else None, parent_event_id=str(parent) if parent else None,
        adapter_version=adapter_version, engine_run_ref=ref,
    )


