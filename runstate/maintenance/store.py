"""MaintenanceStore: the Postgres half of Iceberg maintenance (queue, fences, locks, cache, health).

The queue follows the Snowpack data model (sql/postgres/010_maintenance.sql):
- `jobs` is the durable record; `job_queue` holds a row only while a job is in flight.
- A claim is one `dequeue_with_claim` statement: it picks a visible row with FOR UPDATE SKIP LOCKED,
  writes a fresh attempt_id fence on both rows, bumps attempt_count and sets the lease
  (`visible_at = now() + lease`).
- Every later write of the worker (heartbeat, record_action, complete) matches that attempt_id and a
  live lease, so a worker whose lease expired (and whose job may now belong to someone else) changes
  nothing and is told so by a False return.
- A cancel of a running job is recorded as `status = 'cancelled'` with `completed_at` still NULL:
  the worker sees it between actions and completes the job as cancelled.

Nothing here imports dagster; the Dagster layer in runstate/defs/maintenance wraps this class.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import uuid
import weakref
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from typing import Any, Iterable, Mapping, Sequence

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from runstate.maintenance.errors import MaintenanceError
from runstate.maintenance.identifiers import TableRef, parse_table_ref, validate_actions
from runstate.migrations import check_schema_name, upgrade_postgres

JOB_STATUSES = ("pending", "running", "completed", "failed", "cancelled")
ACTIVE_STATUSES = ("pending", "running")
COMPLETION_STATUSES = ("completed", "failed", "cancelled")
DEFAULT_LEASE_SECONDS = 300.0
_CLAIM_ROUNDS = 16


class TableNotCached(MaintenanceError, LookupError):
    """submit() for a table that the catalog cache (table_cache_entries) does not list."""


class JobNotFound(MaintenanceError, LookupError):
    """A job id that is not in `jobs`."""


class InvalidStatus(MaintenanceError, ValueError):
    """A job status outside the ones the operation accepts."""


# --------------------------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Claim:
    """One fenced claim of a job: every write made with it matches `attempt_id`."""

    job_id: str
    attempt_id: str
    database: str
    table: str
    actions: tuple[str, ...]
    dry_run: bool
    options: Mapping[str, Any] = field(hash=False)  # a dict: left out of the hash so a Claim stays hashable
    attempt_count: int = 0
    worker: str = ""
    lease_seconds: float = DEFAULT_LEASE_SECONDS

    @property
    def table_ref(self) -> TableRef:
        return TableRef(self.database, self.table)

    @property
    def table_key(self) -> str:
        return f"{self.database}.{self.table}"


@dataclass(frozen=True)
class Job:
    job_id: str
    database: str
    table: str
    actions: tuple[str, ...]
    dry_run: bool
    status: str
    submitted_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    error: str | None
    attempt_id: str | None
    deleted_at: datetime | None
    options: Mapping[str, Any] = field(hash=False)
    attempt_count: int | None = None
    claimed_by: str | None = None
    visible_at: datetime | None = None

    @property
    def table_key(self) -> str:
        return f"{self.database}.{self.table}"

    @property
    def cancel_requested(self) -> bool:
        """Cancelled while running: the worker has not stopped yet."""
        return self.status == "cancelled" and self.completed_at is None

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_STATUSES


@dataclass(frozen=True)
class ActionRecord:
    id: int
    job_id: str
    action: str
    success: bool
    message: str
    error: str | None
    elapsed_seconds: float
    created_at: datetime


@dataclass(frozen=True)
class CachedTable:
    """One row of table_cache_entries: a catalog table and its opt-in flag (None = unset)."""

    database: str
    table: str
    maintenance_enabled: bool | None = None
    payload: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @property
    def table_key(self) -> str:
        return f"{self.database}.{self.table}"


@dataclass(frozen=True)
class HealthSnapshot:
    """One row of health_snapshots; field names are the column names (database/table shortened).

    HealthAnalyzer.analyze() builds it (id None until stored); latest_health() reads it back.
    """

    database: str
    table: str
    needs_maintenance: bool
    total_data_files: int = 0
    total_delete_files: int = 0
    total_size_bytes: int = 0
    avg_file_size_bytes: float = 0.0
    small_file_count: int = 0
    small_file_pct: float = 0.0
    snapshot_count: int = 0
    manifest_count: int = 0
    maintenance_enabled: bool | None = None
    maintenance_cadence_hours: int | None = None
    recommended_actions: Sequence[str] = field(default=(), hash=False)  # the analyzer's is a list
    error: str | None = None
    total_records: int = 0
    snapshot_id: int = 0
    health_status: str = "Unknown"
    hours_since_last_snapshot: float = 0.0
    oldest_snapshot_age_hours: float = 0.0
    checked_at: datetime | None = None
    id: int | None = None

    @property
    def table_key(self) -> str:
        return f"{self.database}.{self.table}"


@dataclass(frozen=True)
class OrchestratorRun:
    started_at: datetime
    completed_at: datetime
    status: str
    tables_assessed: int = 0
    tables_skipped: int = 0
    tables_healthy: int = 0
    jobs_submitted: int = 0
    jobs_completed: int = 0
    jobs_failed: int = 0
    dry_run: bool = False
    error: str | None = None
    id: int | None = None
    created_at: datetime | None = None


# ------------------------------------------------------------------------------------------------ SQL

_JOB_COLUMNS = (
    "j.job_id, j.database_name, j.table_name, j.actions, j.dry_run, j.status, j.submitted_at, j.started_at,"
    " j.completed_at, j.error, j.attempt_id, j.deleted_at, j.options,"
    " q.attempt_count, q.claimed_by, q.visible_at"
)

SUBMIT_LOCK_SQL = "SELECT pg_advisory_xact_lock(%s)"
TABLE_IS_CACHED_SQL = "SELECT 1 FROM table_cache_entries WHERE database_name = %s AND table_name = %s"
ACTIVE_JOB_ID_SQL = (
    "SELECT job_id FROM jobs WHERE database_name = %s AND table_name = %s"
    " AND status IN ('pending', 'running') AND deleted_at IS NULL ORDER BY submitted_at LIMIT 1"
)
INSERT_JOB_SQL = (
    "INSERT INTO jobs (job_id, database_name, table_name, actions, dry_run, status, submitted_at, options)"
    " VALUES (%s, %s, %s, %s, %s, 'pending', now(), %s)"
)
ENQUEUE_JOB_SQL = "INSERT INTO job_queue (job_id, enqueued_at, visible_at, attempt_count) VALUES (%s, now(), now(), 0)"

# attempt_count is nullable in the seed (DEFAULT 0): NULL reads as 0 everywhere.
# Locking rule: every change of an in-flight job's status (claim, complete, cancel, sweep) first locks its
# job_queue row, so whoever holds that row lock can read the job's status without locking the jobs row.
# The ordered picks below read job_queue alone: with a join, stale statistics (a queue filled faster than
# autovacuum analyzes it) make the planner sort the whole queue on every claim instead of reading the
# first entries of the partial index.

# Claimed rows whose last lease ran out with no attempts left: the job fails (or, if it was being
# cancelled, ends cancelled). Part of the sweep, which a claim also runs when it meets such a row.
_EXHAUSTED_CTES = """
exhausted AS (
    SELECT q.job_id, q.attempt_count, q.claimed_by
    FROM job_queue q
    WHERE q.claimed_at IS NOT NULL AND q.visible_at <= now() AND COALESCE(q.attempt_count, 0) >= %(max_attempts)s
    FOR NO KEY UPDATE SKIP LOCKED
),
exhausted_dequeued AS (
    DELETE FROM job_queue q USING exhausted x WHERE q.job_id = x.job_id
),
exhausted_finished AS (
    UPDATE jobs j SET
        status = CASE WHEN j.status = 'cancelled' THEN 'cancelled' ELSE 'failed' END,
        completed_at = now(),
        error = CASE WHEN j.status = 'cancelled' THEN j.error ELSE format(
            'job %%s on %%s.%%s failed: gave up after %%s attempts (max_attempts=%%s); the lease of the last attempt'
            ' (worker %%s) expired before the job completed',
            j.job_id, j.database_name, j.table_name, x.attempt_count, %(max_attempts)s, x.claimed_by) END
    FROM exhausted x WHERE j.job_id = x.job_id AND j.status IN ('pending', 'running', 'cancelled')
    RETURNING j.job_id
)"""

# `picked` (job_id) rows whose queue row this statement holds locked: a job cancelled while running whose
# worker is gone (its lease ran out) is finished as cancelled instead of being handed out again.
_FINISH_CANCELLED_CTES = """
picked_jobs AS (
    SELECT j.job_id, j.status FROM jobs j JOIN picked p ON p.job_id = j.job_id
),
cancelled_dequeued AS (
    DELETE FROM job_queue q USING picked_jobs p WHERE q.job_id = p.job_id AND p.status = 'cancelled'
),
cancelled_finished AS (
    UPDATE jobs j SET completed_at = now()
    FROM picked_jobs p WHERE j.job_id = p.job_id AND p.status = 'cancelled' AND j.completed_at IS NULL
    RETURNING j.job_id
)"""

# The dequeue_with_claim CTE. It takes the oldest expired lease through idx_job_queue_claimed
# (retries first, so new work cannot starve them) and, only when there is none,
# the oldest never-claimed row through idx_job_queue_ready: two index probes, never a sort of the queue.
# SKIP LOCKED: a row another claim, completion or cancel holds is passed over, never waited on.
# NO KEY UPDATE, not UPDATE: it must not block the FK KEY SHARE lock that inserting job_actions takes.
# A picked row that must not run again (its lease used the last attempt, or its job was cancelled while
# the worker died) is not claimed; claim() then runs SWEEP_STALE_CLAIMS_SQL, which finishes it, and looks
# again. That keeps the hot statement small.
DEQUEUE_WITH_CLAIM_SQL = """
WITH lease_expired AS (
    SELECT q.job_id
    FROM job_queue q
    WHERE q.claimed_at IS NOT NULL AND q.visible_at <= now()
    ORDER BY q.visible_at
    LIMIT 1
    FOR NO KEY UPDATE SKIP LOCKED
),
ready AS (
    SELECT q.job_id
    FROM job_queue q
    WHERE NOT EXISTS (SELECT 1 FROM lease_expired)
      AND q.claimed_at IS NULL AND q.visible_at <= now()
    ORDER BY q.visible_at
    LIMIT 1
    FOR NO KEY UPDATE SKIP LOCKED
),
picked AS (
    SELECT job_id FROM lease_expired UNION ALL SELECT job_id FROM ready
),
claimed AS (
    UPDATE job_queue q SET
        claimed_at = now(), claimed_by = %(worker)s, attempt_id = %(attempt_id)s,
        attempt_count = COALESCE(q.attempt_count, 0) + 1, visible_at = now() + make_interval(secs => %(lease_seconds)s)
    FROM picked p JOIN jobs j ON j.job_id = p.job_id
    WHERE q.job_id = p.job_id AND COALESCE(q.attempt_count, 0) < %(max_attempts)s
      AND j.status IN ('pending', 'running')
    RETURNING q.job_id, q.attempt_count
),
-- The status recheck is against the newest row version: a cancel that slipped in is never overwritten.
started AS (
    UPDATE jobs j SET status = 'running', started_at = now(), attempt_id = %(attempt_id)s
    FROM claimed c WHERE j.job_id = c.job_id AND j.status IN ('pending', 'running')
    RETURNING j.job_id, j.database_name, j.table_name, j.actions, j.dry_run, j.options, c.attempt_count
),
-- The claim commits without waiting for its WAL flush: a claim lost in a crash loses nothing (the job is
-- still queued, and the fence refuses the worker that held it), and the worker's next durable write (the
-- table lock, an action, the completion) flushes it anyway. That halves the fsyncs per job.
no_flush_wait AS (
    SELECT set_config('synchronous_commit', 'off', true)
)
SELECT s.job_id, s.database_name, s.table_name, s.actions, s.dry_run, s.options, s.attempt_count,
       (SELECT count(*) FROM picked) AS picked
FROM no_flush_wait LEFT JOIN started s ON true
"""

# Expired leases with attempts left go back to pending (fence cleared); exhausted ones fail; a job
# cancelled while running whose worker is gone ends cancelled.
SWEEP_STALE_CLAIMS_SQL = f"""
WITH {_EXHAUSTED_CTES},
picked AS (
    SELECT q.job_id
    FROM job_queue q
    WHERE q.claimed_at IS NOT NULL AND q.visible_at <= now() AND COALESCE(q.attempt_count, 0) < %(max_attempts)s
    FOR NO KEY UPDATE SKIP LOCKED
),
{_FINISH_CANCELLED_CTES},
requeued AS (
    UPDATE job_queue q SET claimed_at = NULL, claimed_by = NULL, attempt_id = NULL
    FROM picked_jobs p WHERE q.job_id = p.job_id AND p.status IN ('pending', 'running')
    RETURNING q.job_id
),
reset AS (
    UPDATE jobs j SET status = 'pending', attempt_id = NULL
    FROM requeued r WHERE j.job_id = r.job_id AND j.status IN ('pending', 'running')
    RETURNING j.job_id
)
SELECT (SELECT count(*) FROM exhausted_finished) + (SELECT count(*) FROM cancelled_finished)
     + (SELECT count(*) FROM reset)
"""

# The fence: same attempt and a lease that has not run out.
HEARTBEAT_SQL = (
    "UPDATE job_queue SET visible_at = now() + make_interval(secs => %(lease_seconds)s)"
    " WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s AND visible_at > now()"
)
COMPLETE_SQL = """
WITH fenced AS (
    DELETE FROM job_queue
    WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s AND visible_at > now()
    RETURNING job_id
)
UPDATE jobs j SET status = %(status)s, completed_at = now(), error = %(error)s
FROM fenced f WHERE j.job_id = f.job_id AND j.attempt_id = %(attempt_id)s
RETURNING j.job_id
"""
COMPLETED_BY_ATTEMPT_SQL = (
    "SELECT 1 FROM jobs j WHERE j.job_id = %(job_id)s AND j.attempt_id = %(attempt_id)s AND j.status = %(status)s"
    " AND j.completed_at IS NOT NULL AND NOT EXISTS (SELECT 1 FROM job_queue q WHERE q.job_id = j.job_id)"
)
# FOR SHARE: a concurrent re-claim (which updates the row) is waited for and then rechecked, so an action
# can never be recorded under a fence that was replaced meanwhile. One row per action per attempt.
RECORD_ACTION_SQL = """
INSERT INTO job_actions (job_id, action, success, message, error, elapsed_seconds)
SELECT q.job_id, %(action)s, %(success)s, %(message)s, %(error)s, %(elapsed_seconds)s
FROM job_queue q
WHERE q.job_id = %(job_id)s AND q.attempt_id = %(attempt_id)s AND q.visible_at > now()
  AND NOT EXISTS (
      SELECT 1 FROM job_actions a
      WHERE a.job_id = q.job_id AND a.action = %(action)s AND a.created_at >= q.claimed_at)
FOR SHARE OF q
RETURNING id
"""
FENCE_HOLDS_SQL = (
    "SELECT 1 FROM job_queue WHERE job_id = %(job_id)s AND attempt_id = %(attempt_id)s AND visible_at > now()"
)
CANCEL_STATUS_SQL = "SELECT status FROM jobs WHERE job_id = %s"

LOCK_QUEUE_ROW_SQL = "SELECT visible_at > now() AND claimed_at IS NOT NULL FROM job_queue WHERE job_id = %s FOR UPDATE"
LOCK_JOB_ROW_SQL = "SELECT status, completed_at FROM jobs WHERE job_id = %s FOR UPDATE"
REQUEST_CANCEL_SQL = "UPDATE jobs SET status = 'cancelled' WHERE job_id = %s"
DEQUEUE_SQL = "DELETE FROM job_queue WHERE job_id = %s"
CANCEL_NOW_SQL = "UPDATE jobs SET status = 'cancelled', completed_at = now() WHERE job_id = %s"
SOFT_DELETE_SQL = "UPDATE jobs SET deleted_at = now() WHERE job_id = %s AND deleted_at IS NULL"

GET_JOB_SQL = f"SELECT {_JOB_COLUMNS} FROM jobs j LEFT JOIN job_queue q ON q.job_id = j.job_id WHERE j.job_id = %s"
_LIST_FILTERS = (
    " WHERE (%(status)s::text IS NULL OR j.status = %(status)s)"
    " AND (%(database)s::text IS NULL OR (j.database_name = %(database)s AND j.table_name = %(table)s))"
)
LIST_LIVE_JOBS_SQL = (
    "SELECT j.job_id, j.database_name, j.table_name, j.actions, j.dry_run, j.status, j.submitted_at, j.started_at,"
    " j.completed_at, j.error, j.attempt_id, j.deleted_at, j.options, j.attempt_count, j.claimed_by, j.visible_at"
    " FROM live_jobs j" + _LIST_FILTERS + " ORDER BY j.submitted_at DESC LIMIT %(limit)s"
)
LIST_ALL_JOBS_SQL = (
    f"SELECT {_JOB_COLUMNS} FROM jobs j LEFT JOIN job_queue q ON q.job_id = j.job_id"
    + _LIST_FILTERS
    + " ORDER BY j.submitted_at DESC LIMIT %(limit)s"
)
JOB_ACTIONS_SQL = (
    "SELECT id, job_id, action, success, message, error, elapsed_seconds, created_at"
    " FROM job_actions WHERE job_id = %s ORDER BY id"
)
QUEUE_DEPTH_SQL = "SELECT count(*) FILTER (WHERE visible_at <= now()), count(*) FROM job_queue"

ACQUIRE_LOCK_SQL = """
INSERT INTO table_locks AS l (table_key, holder, acquired_at, expires_at)
VALUES (%(table_key)s, %(holder)s, now(), now() + make_interval(secs => %(ttl_seconds)s))
ON CONFLICT (table_key) DO UPDATE SET
    holder = EXCLUDED.holder,
    acquired_at = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > now() THEN l.acquired_at ELSE now() END,
    expires_at = EXCLUDED.expires_at
WHERE l.expires_at <= now() OR l.holder = EXCLUDED.holder
RETURNING holder
"""
RELEASE_LOCK_SQL = "DELETE FROM table_locks WHERE table_key = %s AND holder = %s"
SWEEP_LOCKS_SQL = "DELETE FROM table_locks WHERE expires_at <= now()"
GET_LOCK_SQL = "SELECT holder, acquired_at, expires_at, expires_at > now() FROM table_locks WHERE table_key = %s"

# SHARE ROW EXCLUSIVE: one replace at a time, while readers keep seeing the previous inventory.
LOCK_CACHE_SQL = "LOCK TABLE table_cache_entries IN SHARE ROW EXCLUSIVE MODE"
CLEAR_CACHE_SQL = "DELETE FROM table_cache_entries"
INSERT_CACHE_SQL = (
    "INSERT INTO table_cache_entries (database_name, table_name, maintenance_enabled, payload)"
    " SELECT * FROM unnest(%s::text[], %s::text[], %s::bool[], %s::jsonb[])"
)
MARK_SYNCED_SQL = (
    "INSERT INTO table_cache_meta (id, last_synced_at) VALUES (1, now())"
    " ON CONFLICT (id) DO UPDATE SET last_synced_at = EXCLUDED.last_synced_at"
)
CACHED_TABLES_SQL = (
    "SELECT database_name, table_name, maintenance_enabled, payload FROM table_cache_entries"
    " ORDER BY database_name, table_name"
)
ENABLED_CACHED_TABLES_SQL = (
    "SELECT database_name, table_name, maintenance_enabled, payload FROM table_cache_entries"
    " WHERE maintenance_enabled = TRUE ORDER BY database_name, table_name"
)
LAST_SYNCED_SQL = "SELECT last_synced_at FROM table_cache_meta WHERE id = 1"

_HEALTH_VALUE_COLUMNS = tuple(
    name for name in (f.name for f in fields(HealthSnapshot)) if name not in ("database", "table", "id", "checked_at")
)
INSERT_HEALTH_SQL = (
    "INSERT INTO health_snapshots (database_name, table_name, checked_at, "
    + ", ".join(_HEALTH_VALUE_COLUMNS)
    + ") VALUES (%(database)s, %(table)s, COALESCE(%(checked_at)s, now()), "
    + ", ".join(f"%({name})s" for name in _HEALTH_VALUE_COLUMNS)
    + ") RETURNING id"
)
_HEALTH_SELECT = (
    "SELECT id, database_name AS database, table_name AS \"table\", checked_at, "
    + ", ".join(_HEALTH_VALUE_COLUMNS)
    + " FROM health_snapshots"
)
LATEST_HEALTH_SQL = (
    _HEALTH_SELECT + " WHERE database_name = %s AND table_name = %s ORDER BY checked_at DESC, id DESC LIMIT 1"
)
# Retention keeps the newest row of every table however old: cached health reads need one.
PRUNE_HEALTH_SQL = """
DELETE FROM health_snapshots h
WHERE h.checked_at < now() - make_interval(secs => %(keep_days)s * 86400)
  AND h.id NOT IN (
      SELECT DISTINCT ON (database_name, table_name) id FROM health_snapshots
      ORDER BY database_name, table_name, checked_at DESC, id DESC)
"""

_RUN_VALUE_COLUMNS = tuple(name for name in (f.name for f in fields(OrchestratorRun)) if name not in ("id", "created_at"))
INSERT_ORCHESTRATOR_RUN_SQL = (
    "INSERT INTO orchestrator_runs (" + ", ".join(_RUN_VALUE_COLUMNS) + ") VALUES ("
    + ", ".join(f"%({name})s" for name in _RUN_VALUE_COLUMNS)
    + ") RETURNING id"
)
ORCHESTRATOR_RUNS_SQL = (
    "SELECT id, created_at, " + ", ".join(_RUN_VALUE_COLUMNS) + " FROM orchestrator_runs"
    " ORDER BY started_at DESC, id DESC LIMIT %s"
)


# -------------------------------------------------------------------------------------------- helpers


def _json_object(value: Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    """A JSON-serialisable dict with string keys, or a clear ValueError."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be a mapping, got {type(value).__name__}")
    if not all(isinstance(key, str) for key in value):
        raise ValueError(f"{what} keys must be strings: {list(value)!r}")
    try:
        return json.loads(json.dumps(dict(value), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be JSON-serialisable: {exc}") from exc


def _seconds(value: float, what: str) -> float:
    """A finite, non-negative duration. Zero is allowed: a lease or lock that is expired at once."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a non-negative number of seconds, got {value!r}")
    return float(value)


def _non_empty_text(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise ValueError(f"{what} must be a non-empty string without NUL, got {value!r}")
    return value


def _text(value: object) -> str | None:
    """Free text for a TEXT column: Postgres refuses NUL, and a Spark error can carry anything."""
    if value is None:
        return None
    return (value if isinstance(value, str) else str(value)).replace("\x00", "\\0")


def _bool(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{what} must be True or False, got {value!r}")
    return value


def _recommended_actions(actions: Iterable[str] | str | None) -> tuple[str, ...]:
    if actions is None or (not isinstance(actions, str) and not list(actions)):
        return ()
    return validate_actions(actions)


def _job(row: Sequence[Any]) -> Job:
    return Job(
        job_id=row[0], database=row[1], table=row[2], actions=tuple(row[3]), dry_run=row[4], status=row[5],
        submitted_at=row[6], started_at=row[7], completed_at=row[8], error=row[9], attempt_id=row[10],
        deleted_at=row[11], options=row[12] or {}, attempt_count=row[13], claimed_by=row[14], visible_at=row[15],
    )


def _cached(row: Sequence[Any]) -> CachedTable:
    return CachedTable(database=row[0], table=row[1], maintenance_enabled=row[2], payload=row[3] or {})


def _advisory_key(*parts: str) -> int:
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


# ---------------------------------------------------------------------------------------------- store

_INHERITED_CONNECTIONS: list["_HeldConnection"] = []


class _HeldConnection:
    """One thread's connection; closed when the thread's local storage is released at thread exit."""

    __slots__ = ("conn", "pid", "__weakref__")

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn, self.pid = conn, os.getpid()

    def __del__(self) -> None:
        if self.pid == os.getpid() and not self.conn.closed:
            self.conn.close()



class MaintenanceStore:
    """Queue, fences, table locks, catalog cache, health rows and orchestrator audit in one Postgres schema.

    Connections open lazily, one per thread (psycopg connections are not for concurrent use), in
    autocommit mode: each queue operation is a single statement, multi-statement writes use a
    transaction. Safe to share between threads; after a fork the child opens its own connections.
    """

    def __init__(self, dsn: str, *, schema: str = "runstate", max_attempts: int = 3) -> None:
        self.dsn = dsn
        self.schema = check_schema_name(schema)
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"max_attempts must be a positive integer, got {max_attempts!r}")
        self.max_attempts = max_attempts
        self._local = threading.local()
        # Weak: a thread's connection is closed when the thread ends and its thread-local goes away.
        self._opened: weakref.WeakSet[_HeldConnection] = weakref.WeakSet()
        self._opened_lock = threading.Lock()

    # -- connections -------------------------------------------------------------------------------

    def _conn(self) -> psycopg.Connection:
        held = getattr(self._local, "held", None)
        if held is not None and held.pid != os.getpid():
            # Inherited through fork: the socket is the parent's. Never close it here (that would end
            # the parent's session); park it so it is never finalised in this process.
            _INHERITED_CONNECTIONS.append(held)
            held = None
        if held is None or held.conn.closed or held.conn.broken:
            conn = psycopg.connect(
                self.dsn, autocommit=True, options=f"-c search_path={self.schema}",
                application_name="runstate-maintenance",
            )
            held = _HeldConnection(conn)
            self._local.held = held
            with self._opened_lock:
                self._opened.add(held)
        return held.conn

    def close(self) -> None:
        """Close every connection this store opened in this process (threads' ones included)."""
        with self._opened_lock:
            opened = list(self._opened)
        for held in opened:
            if held.pid == os.getpid():
                held.conn.close()
        self._local = threading.local()

    def __enter__(self) -> "MaintenanceStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ensure_schema(self) -> None:
        """Create or upgrade the maintenance tables in `schema`; idempotent and safe to race."""
        upgrade_postgres(self.dsn, self.schema)

    # -- submit ------------------------------------------------------------------------------------

    def submit(
        self,
        database: str,
        table: str,
        actions: Iterable[str] | str,
        dry_run: bool = False,
        options: Mapping[str, Any] | None = None,
    ) -> str:
        """Queue a job for `database.table`, or return the id of the job already pending/running for it.

        Everything is validated before any SQL runs. Raises InvalidIdentifier / UnknownAction (ValueError)
        for bad input and TableNotCached when the catalog cache does not list the table.
        """
        ref = TableRef(database, table)
        ordered_actions = validate_actions(actions)
        dry_run = _bool(dry_run, "dry_run")
        job_options = _json_object(options, "options")
        conn = self._conn()
        with conn.transaction(), conn.cursor() as cur:
            # Serialises submits for one table, so "one active job per table" holds under concurrency.
            cur.execute(SUBMIT_LOCK_SQL, (_advisory_key("runstate.maintenance.submit", self.schema, ref.key),))
            cur.execute(TABLE_IS_CACHED_SQL, (ref.database, ref.table))
            if cur.fetchone() is None:
                raise TableNotCached(
                    f"table {ref.key!r} is not in the catalog cache (table_cache_entries in schema "
                    f"{self.schema!r}); materialize table_inventory first"
                )
            cur.execute(ACTIVE_JOB_ID_SQL, (ref.database, ref.table))
            existing = cur.fetchone()
            if existing is not None:
                return existing[0]
            job_id = str(uuid.uuid4())
            cur.execute(INSERT_JOB_SQL, (job_id, ref.database, ref.table, list(ordered_actions), dry_run, Jsonb(job_options)))
            cur.execute(ENQUEUE_JOB_SQL, (job_id,))
        return job_id

    # -- claim and the fenced writes ---------------------------------------------------------------

    def claim(self, worker: str, lease_seconds: float = DEFAULT_LEASE_SECONDS) -> Claim | None:
        """Claim the oldest visible job (expired leases first, then new ones), or None when there is none.

        A claimed job whose last lease expired with no attempts left is failed on the spot (the reason
        in `error`), and a job cancelled while its worker died ends cancelled; neither is handed out.
        """
        worker = _non_empty_text(worker, "worker")
        lease_seconds = _seconds(lease_seconds, "lease_seconds")
        attempt_id = str(uuid.uuid4())
        params = {
            "worker": worker,
            "lease_seconds": lease_seconds,
            "attempt_id": attempt_id,
            "max_attempts": self.max_attempts,
        }
        conn = self._conn()
        for _ in range(_CLAIM_ROUNDS):
            row = conn.execute(DEQUEUE_WITH_CLAIM_SQL, params).fetchone()
            *job, picked = row
            if picked and job[0] is None:
                # Finish what must not run again (out of attempts, cancelled with a dead worker) now,
                # so such a job fails or ends the moment a claim meets it, not at the next sweep.
                self.sweep_stale_claims()
            if job[0] is not None:
                break
            if not picked:
                return None
            # The row picked belonged to a job that must not run (finished just above): look again.
        else:
            return None  # only rows that must not run in every round: leave them to the sweep schedule
        job_id, database, table, actions, dry_run, options, attempt_count = job
        return Claim(
            job_id=job_id, attempt_id=attempt_id, database=database, table=table, actions=tuple(actions),
            dry_run=dry_run, options=options or {}, attempt_count=attempt_count, worker=worker,
            lease_seconds=lease_seconds,
        )

    def heartbeat(self, claim: Claim, lease_seconds: float | None = None) -> bool:
        """Extend the lease; False when the claim is fenced out or its lease already ran out (stop work)."""
        lease = _seconds(lease_seconds if lease_seconds is not None else claim.lease_seconds, "lease_seconds")
        params = {"job_id": claim.job_id, "attempt_id": claim.attempt_id, "lease_seconds": lease}
        return self._conn().execute(HEARTBEAT_SQL, params).rowcount == 1

    def record_action(
        self,
        claim: Claim,
        action: str,
        success: bool,
        message: str = "",
        error: str | None = None,
        elapsed_seconds: float = 0.0,
    ) -> bool:
        """Record one action's result under the claim's fence; False (nothing written) when fenced out.

        Retry-safe: recording the same action again in the same attempt writes nothing and returns True.
        """
        validate_actions([action])
        params = {
            "job_id": claim.job_id,
            "attempt_id": claim.attempt_id,
            "action": action,
            "success": _bool(success, "success"),
            "message": _text(message) or "",
            "error": _text(error),
            "elapsed_seconds": max(0.0, float(elapsed_seconds)),
        }
        conn = self._conn()
        if conn.execute(RECORD_ACTION_SQL, params).fetchone() is not None:
            return True
        return conn.execute(FENCE_HOLDS_SQL, params).fetchone() is not None

    def complete(self, claim: Claim, status: str, error: str | None = None) -> bool:
        """Finish the job under the claim's fence: drop its queue row, set the terminal status.

        `status` is completed, failed or cancelled. False when fenced out (nothing changes). Repeating a
        completion that already succeeded with the same attempt and status returns True.
        """
        if status not in COMPLETION_STATUSES:
            raise InvalidStatus(f"job {claim.job_id}: completion status {status!r} is not one of {COMPLETION_STATUSES}")
        params = {"job_id": claim.job_id, "attempt_id": claim.attempt_id, "status": status, "error": _text(error)}
        conn = self._conn()
        if conn.execute(COMPLETE_SQL, params).fetchone() is not None:
            return True
        return conn.execute(COMPLETED_BY_ATTEMPT_SQL, params).fetchone() is not None

    def fail(self, claim: Claim, error: str) -> bool:
        """complete(claim, "failed", error)."""
        return self.complete(claim, "failed", error)

    def is_cancel_requested(self, claim: Claim) -> bool:
        row = self._conn().execute(CANCEL_STATUS_SQL, (claim.job_id,)).fetchone()
        return row is not None and row[0] == "cancelled"

    def sweep_stale_claims(self) -> int:
        """Expired leases back to pending (fence cleared); out of attempts -> failed. Returns rows changed."""
        row = self._conn().execute(SWEEP_STALE_CLAIMS_SQL, {"max_attempts": self.max_attempts}).fetchone()
        return int(row[0])

    # -- cancel / delete ---------------------------------------------------------------------------

    def cancel(self, job_id: str) -> str:
        """Cancel a job: "cancelled" when it was not running, "cancel_requested" when a live worker holds
        it (it stops between actions), else the terminal status it already had."""
        conn = self._conn()
        with conn.transaction(), conn.cursor() as cur:
            # Queue row first, then job row: the same order as complete(), so the two never deadlock.
            cur.execute(LOCK_QUEUE_ROW_SQL, (job_id,))
            queue_row = cur.fetchone()
            cur.execute(LOCK_JOB_ROW_SQL, (job_id,))
            job_row = cur.fetchone()
            if job_row is None:
                raise JobNotFound(f"maintenance job {job_id!r} does not exist in schema {self.schema!r}")
            status, completed_at = job_row
            if status == "cancelled":
                return "cancelled" if completed_at is not None else "cancel_requested"
            if status not in ACTIVE_STATUSES:
                return status
            worker_alive = bool(queue_row and queue_row[0])
            if status == "running" and worker_alive:
                cur.execute(REQUEST_CANCEL_SQL, (job_id,))
                return "cancel_requested"
            cur.execute(DEQUEUE_SQL, (job_id,))
            cur.execute(CANCEL_NOW_SQL, (job_id,))
            return "cancelled"

    def soft_delete(self, job_id: str) -> bool:
        """Tombstone a job (hidden from live_jobs); an active job is cancelled first. False if already deleted."""
        self.cancel(job_id)
        return self._conn().execute(SOFT_DELETE_SQL, (job_id,)).rowcount == 1

    # -- reads -------------------------------------------------------------------------------------

    def get_job(self, job_id: str) -> Job | None:
        """The job, soft-deleted or not; None when unknown."""
        row = self._conn().execute(GET_JOB_SQL, (job_id,)).fetchone()
        return _job(row) if row else None

    def list_jobs(
        self,
        status: str | None = None,
        table_key: str | None = None,
        limit: int = 100,
        include_deleted: bool = False,
    ) -> list[Job]:
        """Newest first; from the live_jobs view unless include_deleted."""
        if status is not None and status not in JOB_STATUSES:
            raise InvalidStatus(f"job status {status!r} is not one of {JOB_STATUSES}")
        ref = parse_table_ref(table_key) if table_key is not None else None
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit!r}")
        params = {
            "status": status,
            "database": ref.database if ref else None,
            "table": ref.table if ref else None,
            "limit": limit,
        }
        query = LIST_ALL_JOBS_SQL if include_deleted else LIST_LIVE_JOBS_SQL
        return [_job(row) for row in self._conn().execute(query, params).fetchall()]

    def active_job(self, table_key: str) -> Job | None:
        """The pending or running job of a table, if any."""
        ref = parse_table_ref(table_key)
        row = self._conn().execute(ACTIVE_JOB_ID_SQL, (ref.database, ref.table)).fetchone()
        return self.get_job(row[0]) if row else None

    def job_actions(self, job_id: str) -> list[ActionRecord]:
        rows = self._conn().execute(JOB_ACTIONS_SQL, (job_id,)).fetchall()
        return [ActionRecord(*row) for row in rows]

    def queue_depth(self) -> tuple[int, int]:
        """(claimable now, all in flight)."""
        ready, total = self._conn().execute(QUEUE_DEPTH_SQL).fetchone()
        return int(ready), int(total)

    # -- table locks -------------------------------------------------------------------------------

    def acquire_table_lock(self, table_key: str, holder: str, ttl_seconds: float) -> bool:
        """Take the table's lock until now + ttl. A live lock of another holder is never taken over;
        an expired one is. The current holder calling again extends its lease (a lock heartbeat)."""
        ref = parse_table_ref(table_key)
        params = {
            "table_key": ref.key,
            "holder": _non_empty_text(holder, "lock holder"),
            "ttl_seconds": _seconds(ttl_seconds, "ttl_seconds"),
        }
        return self._conn().execute(ACQUIRE_LOCK_SQL, params).fetchone() is not None

    def release_table_lock(self, table_key: str, holder: str) -> bool:
        """Release only when `holder` holds it; False otherwise (someone else's lock stays)."""
        ref = parse_table_ref(table_key)
        return self._conn().execute(RELEASE_LOCK_SQL, (ref.key, holder)).rowcount == 1

    def table_lock(self, table_key: str) -> dict[str, Any] | None:
        """{holder, acquired_at, expires_at, live} of the table's lock row, or None."""
        ref = parse_table_ref(table_key)
        row = self._conn().execute(GET_LOCK_SQL, (ref.key,)).fetchone()
        if row is None:
            return None
        return {"holder": row[0], "acquired_at": row[1], "expires_at": row[2], "live": row[3]}

    def sweep_expired_locks(self) -> int:
        return self._conn().execute(SWEEP_LOCKS_SQL).rowcount

    # -- catalog cache -----------------------------------------------------------------------------

    def replace_table_cache(self, entries: Iterable[CachedTable]) -> int:
        """Swap the whole inventory in one transaction and stamp table_cache_meta.last_synced_at."""
        checked = list(entries)
        seen: set[tuple[str, str]] = set()
        payloads = []
        for entry in checked:
            ref = TableRef(entry.database, entry.table)
            if (ref.database, ref.table) in seen:
                raise ValueError(f"table {ref.key!r} appears twice in the catalog inventory")
            seen.add((ref.database, ref.table))
            if entry.maintenance_enabled is not None:
                _bool(entry.maintenance_enabled, f"maintenance_enabled of {ref.key!r}")
            payloads.append(Jsonb(_json_object(entry.payload, f"payload of {ref.key!r}")))
        conn = self._conn()
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(LOCK_CACHE_SQL)
            cur.execute(CLEAR_CACHE_SQL)
            if checked:
                cur.execute(
                    INSERT_CACHE_SQL,
                    (
                        [e.database for e in checked],
                        [e.table for e in checked],
                        [e.maintenance_enabled for e in checked],
                        payloads,
                    ),
                )
            cur.execute(MARK_SYNCED_SQL)
        return len(checked)

    def cached_tables(self, enabled_only: bool = False) -> list[CachedTable]:
        query = ENABLED_CACHED_TABLES_SQL if enabled_only else CACHED_TABLES_SQL
        return [_cached(row) for row in self._conn().execute(query).fetchall()]

    def last_synced_at(self) -> datetime | None:
        row = self._conn().execute(LAST_SYNCED_SQL).fetchone()
        return row[0] if row else None

    # -- health ------------------------------------------------------------------------------------

    def insert_health_snapshot(self, snapshot: HealthSnapshot | Mapping[str, Any]) -> int:
        """Append one health row; returns its id. A mapping may use database/table or *_name keys."""
        if not isinstance(snapshot, HealthSnapshot):
            values = dict(snapshot)
            values.setdefault("database", values.pop("database_name", None))
            values.setdefault("table", values.pop("table_name", None))
            unknown = set(values) - {f.name for f in fields(HealthSnapshot)}
            if unknown:
                raise ValueError(f"health snapshot has unknown column(s) {sorted(unknown)}")
            snapshot = HealthSnapshot(**values)
        ref = TableRef(snapshot.database, snapshot.table)
        params = asdict(snapshot)
        params.update(
            database=ref.database,
            table=ref.table,
            needs_maintenance=_bool(snapshot.needs_maintenance, "needs_maintenance"),
            recommended_actions=list(_recommended_actions(snapshot.recommended_actions)),
        )
        params.pop("id")
        return int(self._conn().execute(INSERT_HEALTH_SQL, params).fetchone()[0])

    def latest_health(self, table_key: str) -> HealthSnapshot | None:
        ref = parse_table_ref(table_key)
        with self._conn().cursor(row_factory=dict_row) as cur:
            row = cur.execute(LATEST_HEALTH_SQL, (ref.database, ref.table)).fetchone()
        if row is None:
            return None
        row["recommended_actions"] = tuple(row["recommended_actions"] or ())
        return HealthSnapshot(**row)

    def prune_health(self, keep_days: float) -> int:
        """Delete health rows older than keep_days, always keeping each table's newest row."""
        if isinstance(keep_days, bool) or not isinstance(keep_days, (int, float)) or keep_days < 0:
            raise ValueError(f"keep_days must be a non-negative number, got {keep_days!r}")
        return self._conn().execute(PRUNE_HEALTH_SQL, {"keep_days": float(keep_days)}).rowcount

    # -- orchestrator ------------------------------------------------------------------------------

    def record_orchestrator_run(self, run: OrchestratorRun | None = None, **values: Any) -> int:
        """Append one orchestrator_runs row (a dataclass, or its fields as keywords); returns its id."""
        if run is None:
            run = OrchestratorRun(**values)
        elif values:
            raise TypeError("pass either an OrchestratorRun or keyword fields, not both")
        _non_empty_text(run.status, "orchestrator run status")
        params = {name: getattr(run, name) for name in _RUN_VALUE_COLUMNS}
        return int(self._conn().execute(INSERT_ORCHESTRATOR_RUN_SQL, params).fetchone()[0])

    def orchestrator_runs(self, limit: int = 20) -> list[OrchestratorRun]:
        with self._conn().cursor(row_factory=dict_row) as cur:
            rows = cur.execute(ORCHESTRATOR_RUNS_SQL, (limit,)).fetchall()
        return [OrchestratorRun(**row) for row in rows]


__all__ = [
    "ActionRecord",
    "CachedTable",
    "Claim",
    "HealthSnapshot",
    "InvalidStatus",
    "Job",
    "JobNotFound",
    "MaintenanceStore",
    "OrchestratorRun",
    "TableNotCached",
]
